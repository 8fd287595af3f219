"""Another machine for a wrapper started on this one: a ``PYTHONPATH`` whose
``sitecustomize`` makes ``socket.gethostname()`` answer the host a test names, so
that the wrapper's owner token (``hostname:pid:nonce``) and its history rows say
that host, as a wrapper on that machine would write them."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path

HOST_VARIABLE = "DISLOCK_TEST_HOST"

_SITE = f"""import os
import socket

_host = os.environ.get({HOST_VARIABLE!r})
if _host:
    socket.gethostname = lambda: _host
"""


@cache
def _site() -> str:
    """The folder of that ``sitecustomize``, one per user, written whole (renamed into
    place) once per test process, so that a wrapper starting meanwhile reads all of it."""
    folder = Path(tempfile.gettempdir()) / f"dislock-test-host-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    written = folder / f"sitecustomize.{os.getpid()}"
    written.write_text(_SITE)
    written.replace(folder / "sitecustomize.py")
    return str(folder)


def on_host(env: Mapping[str, str], host: str) -> dict[str, str]:
    """``env`` for a Python process (the wrapper) that runs as if on ``host``."""
    path = os.pathsep.join(filter(None, (_site(), env.get("PYTHONPATH"))))
    return {**env, "PYTHONPATH": path, HOST_VARIABLE: host}
