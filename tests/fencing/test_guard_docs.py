"""docs/fencing.md's guard, run as pasted: ``init --fencing`` and ``fence`` on a database
of the test's own, the wrapped ``psql`` writing on ``PGOPTIONS`` alone (and refused
without ``LOCK_FENCING``), and the Python block."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.cli.conftest import dislock_on_path
from tests.fencing.test_psql_recipe import _psql_dir

ROOT = Path(__file__).resolve().parents[2]
LIBPQ = {"host": "PGHOST", "port": "PGPORT", "dbname": "PGDATABASE", "user": "PGUSER"}
SECTION = "## The database refuses a stale holder's write"


def blocks(language: str) -> list[str]:
    text = (ROOT / "docs" / "fencing.md").read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


@pytest.fixture
def own_database(db: psycopg.Connection[Any], database_url: str) -> Iterator[str]:
    """A database of this test's own, so that the docs' unqualified tables (the default
    lock table ``key_value``, ``report_pages``) meet no other test's: its URL."""
    name = f"fence_docs_{uuid.uuid4().hex[:8]}"
    db.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_conninfo(database_url, dbname=name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE report_pages (body text)")
    yield url
    db.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_the_guard_as_the_docs_set_it_up(own_database: str, tmp_path: Path) -> None:
    setup, job = blocks("bash")
    params = conninfo_to_dict(own_database)
    service = tmp_path / "pg_service.conf"
    service.write_text(
        "[reports]\n"
        + "".join(
            f"{key}={params[key]}\n" for key in ("host", "port", "dbname", "user") if key in params
        )
    )
    env = {
        name: value for name, value in os.environ.items() if not name.startswith(("PG", "LOCK_"))
    }
    env.update(
        DATABASE_URL=own_database,
        PATH=f"{dislock_on_path(tmp_path)}{os.pathsep}{_psql_dir()}",
        PGSERVICEFILE=str(service),
    )

    def bash(script: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", script],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = bash(setup)
    assert done.returncode == 0, done.stderr
    assert "fenced report_pages" in done.stdout
    written = bash(job)
    assert written.returncode == 0, written.stderr
    refused = bash(job.replace("LOCK_FENCING=1", "LOCK_FENCING=0"))
    assert refused.returncode != 0
    assert "dislock fencing refused this INSERT on public.report_pages" in refused.stderr
    with psycopg.connect(own_database) as conn:
        assert conn.execute("SELECT body FROM report_pages").fetchall() == [("the report",)]

    (python,) = blocks("python")
    ran = subprocess.run(
        [sys.executable, "-c", python],
        env={**env, **{var: str(params[key]) for key, var in LIBPQ.items() if key in params}},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    with psycopg.connect(own_database) as conn:
        assert conn.execute("SELECT count(*) FROM report_pages").fetchone() == (2,)
