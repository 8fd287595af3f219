"""Whether a process a test started (or had started for it) still runs, and the
cleanup of a wrapper a test stops (``SIGSTOP``)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def state(pid: int) -> str | None:
    """The state letter of ``pid`` in ``/proc`` (``R``, ``S``, ``T`` when stopped, ``Z``…);
    None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie awaiting its reaper counts as dead)."""
    return state(pid) not in (None, "Z", "X")


@contextlib.contextmanager
def killed_if_left(process: subprocess.Popen[Any]) -> Iterator[subprocess.Popen[Any]]:
    """``process`` for the block; one still running after it (stopped, perhaps) is
    resumed, killed and reaped, whatever the block raised."""
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
            process.communicate()
