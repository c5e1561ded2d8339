"""Which RabbitMQ a local node runs: the machine's own package, or another Debian release's, kept in a root.

Debian packages one RabbitMQ line per release (12 "bookworm": 3.10, 13 "trixie": 4.0). To run a line the
machine does not have, :func:`install` (``amqp-events broker install 4.0``) makes a minimal root of that
release with ``debootstrap`` and installs Debian's own ``rabbitmq-server`` into it. A node then runs from the
root under ``chroot``, in a mount namespace of its own that shows it the node's directories; it shares the
machine's network, so clients reach it on loopback like any other node.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from amqp_events.environment import variable
from amqp_events.errors import LocalServerError

#: The Debian release that packages each RabbitMQ line.
DEBIAN_RELEASES = {"3.10": "bookworm", "4.0": "trixie"}
SBIN = "/usr/lib/rabbitmq/bin"
#: Inside a root, the node's own directories are shown at ``/amqp-events/0``, ``/amqp-events/1``, ...
MOUNTS = "/amqp-events"
MOUNT_POINTS = 4
#: Run as ``sh -c SCRIPT root count host₁ inner₁ ... program args``: the namespace is private to the process
#: (``unshare``), so its mounts vanish with it and every node can show its own directory at the same place.
_IN_ROOT = """set -e
root=$1 count=$2
shift 2
mount --rbind /proc "$root/proc"
mount --rbind /sys "$root/sys"
while [ "$count" -gt 0 ]; do mount --bind "$1" "$root$2"; shift 2; count=$((count - 1)); done
exec chroot "$root" "$@"
"""


def roots_directory() -> Path:
    """Where :func:`install` keeps its roots: ``$AMQP_EVENTS_RABBITMQ_ROOTS``, else the user's cache directory."""
    configured = variable("AMQP_EVENTS_RABBITMQ_ROOTS")
    if configured:
        return Path(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "amqp-events" / "rabbitmq"


@dataclass(frozen=True)
class Installation:
    """RabbitMQ as installed in ``root``: ``/`` (the machine's own package) or a Debian root made by :func:`install`."""

    root: Path = Path("/")

    @property
    def on_the_machine(self) -> bool:
        return self.root == Path("/")

    @property
    def version(self) -> str | None:
        """The installed version (``"4.0.5"``), read from the package's files; None when none is installed."""
        found = sorted((self.root / "usr/lib/rabbitmq/lib").glob("rabbitmq_server-*"))
        return found[-1].name.removeprefix("rabbitmq_server-") if found else None

    @property
    def line(self) -> str | None:
        """The release line (``"4.0"``)."""
        version = self.version
        return ".".join(version.split(".")[:2]) if version else None

    def __str__(self) -> str:
        where = "" if self.on_the_machine else f" (from the Debian root {self.root})"
        return f"RabbitMQ {self.version or '(not installed)'}{where}"

    def command(
        self, program: str, args: Sequence[str], environment: Mapping[str, str], directories: Sequence[Path] = ()
    ) -> tuple[list[str], dict[str, str]]:
        """The command line and environment that run ``program`` (``rabbitmq-server``, ``rabbitmqctl``, ``epmd``,
        or a path inside the root) of this installation with ``args``; inside a root, ``directories`` are shown
        to it and ``environment``'s paths into them are translated."""
        if self.on_the_machine:
            return [self._program_on_the_machine(program), *args], dict(environment)
        if len(directories) > MOUNT_POINTS:
            raise LocalServerError(f"a node in a root can see {MOUNT_POINTS} directories, not {len(directories)}")
        inner = {Path(directory).absolute(): f"{MOUNTS}/{index}" for index, directory in enumerate(directories)}
        mounts = [str(part) for host, place in inner.items() for part in (host, place)]
        program_path = (
            program if program.startswith("/") else "/usr/bin/epmd" if program == "epmd" else f"{SBIN}/{program}"
        )
        argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _IN_ROOT, "in-root"]
        argv += [str(self.root), str(len(inner)), *mounts, program_path, *args]
        return argv, {key: _translated(value, inner) for key, value in environment.items()}

    def seen_as(self, value: str, directories: Sequence[Path]) -> str:
        """``value`` as the node sees it: a path into one of ``directories`` translated, inside a root."""
        if self.on_the_machine:
            return value
        return _translated(
            value, {Path(directory).absolute(): f"{MOUNTS}/{index}" for index, directory in enumerate(directories)}
        )

    def _program_on_the_machine(self, program: str) -> str:
        if program.startswith("/"):
            return program
        if program == "epmd":
            found = shutil.which("epmd")
            if found is None:
                raise LocalServerError(install_hint(None))
            return found
        return f"{SBIN}/{program}"

    def check(self) -> None:
        """Raise :class:`LocalServerError` with what to do when RabbitMQ is not installed here."""
        if self.version is None:
            raise LocalServerError(install_hint(None if self.on_the_machine else str(self.root)))
        if not self.on_the_machine and os.geteuid() != 0:
            raise LocalServerError(f"running {self} needs root (chroot, mount): run as root or use sudo")


def _translated(value: str, inner: Mapping[Path, str]) -> str:
    for host, place in inner.items():
        if value == str(host) or value.startswith(f"{host}/"):
            return place + value[len(str(host)) :]
    return value


def install_hint(line: str | None) -> str:
    if line is None:
        return (
            "RabbitMQ is not installed: install Debian's package with "
            "`sudo apt-get update && sudo apt-get install -y rabbitmq-server` (the system service does not need to run)"
        )
    return f"RabbitMQ {line} is not installed: `sudo amqp-events broker install {line}` installs it (about a minute)"


def installed() -> list[Installation]:
    """Every installation found: the machine's own, then the roots :func:`install` made."""
    found = [Installation()] if Installation().version else []
    directory = roots_directory()
    if directory.is_dir():
        roots = (Installation(path) for path in sorted(directory.iterdir()) if path.is_dir())
        found += [root for root in roots if root.version]
    return found


def find(wanted: str | None = None) -> Installation:
    """The installation to run a node of: ``wanted`` is a line (``"4.0"``), a root's path, or None (the
    line in ``$AMQP_EVENTS_RABBITMQ``, else the machine's own, else the only root installed)."""
    wanted = wanted or variable("AMQP_EVENTS_RABBITMQ")
    if wanted is not None and "/" in wanted:
        candidate = Installation(Path(wanted))
        candidate.check()
        return candidate
    available = installed()
    for installation in available:
        if wanted is None or installation.line == wanted:
            return installation
    if wanted is not None and wanted not in DEBIAN_RELEASES:
        raise LocalServerError(f"unknown RabbitMQ line {wanted!r}: {' or '.join(DEBIAN_RELEASES)}")
    raise LocalServerError(install_hint(wanted))


def debian_mirror() -> str:
    """The machine's own Debian mirror (from its apt sources), else Debian's default one."""
    for sources in (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")):
        try:
            text = sources.read_text()
        except OSError:
            continue
        found = re.search(r"^\s*(?:URIs:|deb)\s+(\S+/debian)/?\s*$", text, re.MULTILINE)
        found = found or re.search(r"^\s*(?:URIs:|deb)\s+(?:\[[^]]*\]\s+)?(\S+/debian)\s", text, re.MULTILINE)
        if found:
            return found[1]
    return "http://deb.debian.org/debian"


def install(line: str, into: Path | None = None, echo: Callable[[str], object] = print) -> Installation:
    """Install Debian's RabbitMQ ``line`` into a root of its own (kept; doing it again does nothing).

    Needs root, ``debootstrap`` (Debian's package) and the Debian mirror; about a minute and 620 MB.
    """
    if line not in DEBIAN_RELEASES:
        raise LocalServerError(f"unknown RabbitMQ line {line!r}: {' or '.join(DEBIAN_RELEASES)}")
    root = (into or roots_directory() / line).absolute()
    if Installation(root).line == line:
        return Installation(root)
    if os.geteuid() != 0:
        raise LocalServerError("installing RabbitMQ into a Debian root needs root (debootstrap, chroot)")
    if shutil.which("debootstrap") is None:
        raise LocalServerError("debootstrap is not installed: `sudo apt-get install -y debootstrap`")
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    release, mirror = DEBIAN_RELEASES[line], debian_mirror()
    echo(f"making a Debian {release} root in {partial} from {mirror} ...")
    _run(["debootstrap", "--variant=minbase", release, str(partial), mirror])
    # Packages must not try to start services inside the root.
    policy = partial / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    for index in range(MOUNT_POINTS):
        (partial / MOUNTS.lstrip("/") / str(index)).mkdir(parents=True, exist_ok=True)
    echo("installing Debian's rabbitmq-server into it ...")
    in_root = Installation(partial)
    for step in (["update", "-q"], ["install", "-y", "-q", "rabbitmq-server"], ["clean"]):
        _run(*in_root.command("/usr/bin/apt-get", step, {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}))
    shutil.rmtree(root, ignore_errors=True)
    partial.rename(root)
    installation = Installation(root)
    if installation.line != line:
        raise LocalServerError(f"the {release} root has {installation}, not RabbitMQ {line}")
    echo(f"installed {installation}")
    return installation


def _run(argv: list[str], environment: Mapping[str, str] | None = None) -> None:
    done = subprocess.run(argv, env=None if environment is None else dict(environment), capture_output=True, text=True)
    if done.returncode != 0:
        output = (done.stderr.strip() or done.stdout.strip()).splitlines()[-20:]
        raise LocalServerError(f"{argv[0]} {' '.join(argv[1:3])} failed ({done.returncode}):\n" + "\n".join(output))
