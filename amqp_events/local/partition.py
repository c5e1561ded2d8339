"""A network partition of a local cluster: some nodes cut off from the others, then healed.

Every node of a :class:`~amqp_events.local.cluster.LocalCluster` has a
loopback address of its own, and its links to the other nodes (Erlang
distribution) leave from it and arrive at it. The cut is an nftables table
that drops packets between the two sides' addresses, in both directions:
for the nodes it is a network partition, while clients (on 127.0.0.1) still
reach every node, as they would from elsewhere on a network. Healing deletes
the table; :meth:`LocalCluster.stop` does too. Needs root and Debian's
``nftables``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable

from amqp_events.errors import LocalServerError


def table_name(network: str) -> str:
    """The nftables table of the cluster on ``network`` (``127.x.y``): one per cluster, so cuts never mix."""
    return "amqp_events_" + network.replace(".", "_")


def cut(network: str, side: Iterable[int], size: int) -> None:
    """Cut the nodes numbered ``side`` (0-based) off from the other nodes of the cluster on ``network``."""
    minority = sorted(set(side))
    if not minority or len(minority) >= size or not all(0 <= index < size for index in minority):
        raise LocalServerError(f"a partition cuts off 1 to {size - 1} of the {size} nodes, not {minority}")
    inside = ", ".join(f"{network}.{index + 1}" for index in minority)
    outside = ", ".join(f"{network}.{index + 1}" for index in range(size) if index not in minority)
    table = table_name(network)
    heal(network)
    _nft(
        "-f",
        "-",
        script=f"""table inet {table} {{
    chain output {{
        type filter hook output priority 0; policy accept;
        ip saddr {{ {inside} }} ip daddr {{ {outside} }} drop
        ip saddr {{ {outside} }} ip daddr {{ {inside} }} drop
    }}
}}
""",
    )


def heal(network: str) -> bool:
    """Remove the cut of the cluster on ``network``; returns whether there was one."""
    if not is_cut(network):
        return False
    _nft("delete", "table", "inet", table_name(network))
    return True


def is_cut(network: str) -> bool:
    """Is the cluster on ``network`` cut now?"""
    if shutil.which("nft") is None:
        return False
    return f"table inet {table_name(network)}" in _nft("list", "tables").splitlines()


def _nft(*args: str, script: str | None = None) -> str:
    if shutil.which("nft") is None:
        raise LocalServerError("nftables is not installed: `sudo apt-get install -y nftables` (and run as root)")
    done = subprocess.run(["nft", *args], input=script, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise LocalServerError(f"nft {' '.join(args)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout
