"""Reading what a running process prints, with a deadline."""

from __future__ import annotations

import subprocess
import threading


def printed(process: subprocess.Popen[str], count: int, timeout: float) -> list[str]:
    """The next ``count`` lines ``process`` prints, waiting at most ``timeout`` seconds for them."""
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        lines.extend(process.stdout.readline().strip() for _ in range(count))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    assert len(lines) == count, f"{process.args} printed {lines} in {timeout:g}s, not {count} lines"
    return lines
