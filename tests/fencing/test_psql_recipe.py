"""docs/fencing.md's psql recipe, run as written: the database named by a service
file, the password in a password file, nothing secret in psql's arguments."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from tests.support.cluster import _bindir

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "pgpass-secret"


def recipe() -> str:
    text = (ROOT / "docs" / "fencing.md").read_text()
    match = re.search(r"```bash\n# recipe: psql-guarded-write\n(.*?\nSQL\n)```", text, re.DOTALL)
    assert match, "docs/fencing.md lost its psql recipe"
    return match.group(1)


def _psql_dir() -> Path:
    bundled = _bindir()
    if (bundled / "psql").exists():
        return bundled
    found = shutil.which("psql")
    if found is None:
        pytest.skip("no psql")
    return Path(found).parent


@pytest.fixture
def writer(db: psycopg.Connection[Any], lock_table: tuple[str, str]) -> Iterator[str]:
    """A role that may write the recipe's table, in the test's schema."""
    schema = sql.Identifier(lock_table[0])
    role = f"w_{uuid.uuid4().hex[:8]}"
    db.execute(
        sql.SQL(
            "CREATE TABLE {}.report_output (resource text PRIMARY KEY,"
            " fence bigint NOT NULL, body text NOT NULL)"
        ).format(schema)
    )
    db.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(PASSWORD)
        )
    )
    db.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, sql.Identifier(role)))
    db.execute(
        sql.SQL("GRANT SELECT, INSERT, UPDATE ON {}.report_output TO {}").format(
            schema, sql.Identifier(role)
        )
    )
    yield role
    db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_the_psql_recipe_writes_fenced_with_nothing_secret_in_its_arguments(
    database_url: str,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    writer: str,
    tmp_path: Path,
) -> None:
    command = recipe()
    first_line = command.splitlines()[0]
    assert "://" not in command and "URL" not in first_line and "password" not in first_line
    params = conninfo_to_dict(database_url)
    service = tmp_path / "pg_service.conf"
    service.write_text(
        "[reports]\n"
        f"host={params.get('host', 'localhost')}\n"
        f"port={params.get('port', '5432')}\n"
        f"dbname={params['dbname']}\n"
        f"user={writer}\n"
        f"options=-c search_path={lock_table[0]}\n"  # the recipe names the table unqualified
    )
    passwords = tmp_path / "pgpass"
    passwords.write_text(f"*:*:*:{writer}:{PASSWORD}\n")
    for path in (service, passwords):
        path.chmod(0o600)
    env = {name: value for name, value in os.environ.items() if not name.startswith("PG")}
    env.update(
        PATH=f"{_psql_dir()}{os.pathsep}{env.get('PATH', '')}",
        PGSERVICEFILE=str(service),
        PGPASSFILE=str(passwords),
    )

    def run(token: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", command],
            env={**env, "DISLOCK_FENCING_TOKEN": str(token)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    table = sql.SQL("SELECT fence, body FROM {}.report_output").format(
        sql.Identifier(lock_table[0])
    )
    written = run(3)
    assert written.returncode == 0, written.stderr
    assert written.stdout.strip() == "INSERT 0 1"
    assert db.execute(table).fetchall() == [(3, "the report")]
    late = run(2)  # an older holder's write
    assert late.returncode == 0, late.stderr
    assert late.stdout.strip() == "INSERT 0 0"
    assert db.execute(table).fetchall() == [(3, "the report")]
