"""Check a built wheel and sdist (``scripts/dist``): every file of the package inside, data included, and the
metadata users see (its version, the command, the long description). Exits 1 saying what is missing."""

from __future__ import annotations

import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def package_files() -> set[str]:
    """Every file of the package in the checkout that a user's install must have (no caches)."""
    found = set()
    for path in (ROOT / "amqp_events").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
            found.add(path.relative_to(ROOT).as_posix())
    return found


def problems_of_wheel(wheel: Path, version: str) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"celery_amqp_events-{version}.dist-info"
        metadata = Parser().parsestr(archive.read(f"{info}/METADATA").decode())
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    problems = [f"the wheel lacks {name}" for name in sorted(package_files() - names)]
    if metadata["Version"] != version:
        problems.append(f"the wheel says version {metadata['Version']}, pyproject.toml {version}")
    if (
        metadata.get("Description-Content-Type") != "text/markdown"
        or "celery-amqp-events" not in metadata.get_payload()
    ):
        problems.append("the wheel's long description is not the README (text/markdown)")
    if "amqp-events = amqp_events.cli:run" not in entry_points:
        problems.append("the wheel does not install the amqp-events command")
    return problems


def problems_of_sdist(sdist: Path, version: str) -> list[str]:
    with tarfile.open(sdist) as archive:
        prefix = f"celery_amqp_events-{version}/"
        names = {name.removeprefix(prefix) for name in archive.getnames()}
    wanted = package_files() | {"pyproject.toml", "README.md"}
    return [f"the sdist lacks {name}" for name in sorted(wanted - names)]


def main(directory: str) -> int:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    dist = Path(directory)
    wheels, sdists = list(dist.glob(f"*-{version}-*.whl")), list(dist.glob(f"*-{version}.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        print(f"expected one wheel and one sdist of {version} in {dist}, found {wheels + sdists}", file=sys.stderr)
        return 1
    problems = problems_of_wheel(wheels[0], version) + problems_of_sdist(sdists[0], version)
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        size = wheels[0].stat().st_size
        print(f"{wheels[0].name} ({size / 1024:.0f} KiB) and {sdists[0].name}: every file inside, metadata as expected")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "dist")))
