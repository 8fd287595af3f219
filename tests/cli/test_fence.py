"""``dislockctl fence``: a table of the user's refuses every write whose transaction does
not carry the fencing token of the key's live lease, and a wrapped command's libpq
writes carry it through ``PGOPTIONS`` with nothing else to do."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock import LeaseLock, LockContext
from dislock.core.fencing import VERSION
from tests.cli.conftest import Ctl, RunCli

WRITER = textwrap.dedent(
    """
    import os, psycopg
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        token = os.environ.get("DISLOCK_FENCING_TOKEN", "none")
        conn.execute("INSERT INTO {table} VALUES (%s)", (token,))
        print(conn.execute("SHOW statement_timeout").fetchone()[0])
    """
)


@pytest.fixture
def report(db: psycopg.Connection[Any], lock_table: tuple[str, str], ctl: Ctl) -> str:
    """A table of the user's beside a lock table made with ``init --fencing``: its name."""
    assert ctl("init", "--fencing").returncode == 0
    name = f"{lock_table[0]}.report"
    db.execute(sql.SQL("CREATE TABLE {} (body text)").format(sql.Identifier(*name.split("."))))
    return name


def _write(url: str, table: str, token: int | None = None) -> str | None:
    """Insert a row in one transaction carrying ``token``: the error's SQLSTATE and
    first line, or None when it committed."""
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            with conn.transaction():
                if token is not None:
                    conn.execute(
                        "SELECT set_config('dislock.fencing_token', %s, true)", (str(token),)
                    )
                conn.execute(sql.SQL("INSERT INTO {} VALUES ('x')").format(sql.SQL(table)))
        except psycopg.Error as exc:
            return f"{exc.sqlstate}: {str(exc).splitlines()[0]}"
    return None


def test_a_write_without_the_token_is_refused_until_unfence(
    report: str, ctl: Ctl, cli_env: dict[str, str]
) -> None:
    url = cli_env["DATABASE_URL"]
    assert _write(url, report) is None  # not fenced yet

    fenced = ctl("fence", report, "--key", "nightly")
    assert fenced.returncode == 0, fenced.stderr
    assert fenced.stdout == (
        f"fenced {report}: a write commits only with the fencing token of the live lease of"
        " 'nightly' in dislock.fencing_token\n"
    )

    refused = _write(url, report)
    assert refused is not None
    assert refused.startswith("FENCE: dislock fencing refused this INSERT")
    assert "carries no fencing token of lock 'nightly'" in refused

    unfenced = ctl("unfence", report)
    assert unfenced.returncode == 0, unfenced.stderr
    assert unfenced.stdout == (
        f"unfenced {report}: writes no longer need the fencing token of 'nightly'\n"
    )
    assert _write(url, report) is None
    again = ctl("unfence", report)
    assert (again.returncode, again.stderr.strip()) == (
        1,
        f"dislockctl: error: table {report} is not fenced",
    )


def test_a_stale_token_is_refused_and_the_live_one_only_while_live(
    report: str, ctl: Ctl, cli_env: dict[str, str], lock_table: tuple[str, str]
) -> None:
    url = cli_env["DATABASE_URL"]
    assert ctl("fence", report, "--key", "nightly").returncode == 0
    context = LockContext(
        url=url,
        table_parts=list(lock_table),
        lock_key="nightly",
        owner="a",
        fencing=True,
        run_ttl_seconds=30.0,
        lease_interval_seconds=5.0,
    )
    with LeaseLock(context) as first:
        assert _write(url, report, first.fence) is None
    stale = first.fence
    assert stale is not None
    refused = _write(url, report, stale)  # released: no holder at all
    assert refused is not None and "is not that of a live lease of lock 'nightly'" in refused
    with LeaseLock(dataclasses.replace(context, owner="b")) as second:
        assert second.fence == stale + 1
        assert _write(url, report, second.fence) is None
        refused = _write(url, report, stale)
        assert refused is not None and refused.startswith("FENCE:")
    assert _write(url, report, second.fence) is not None  # released again


def test_a_wrapped_command_writes_with_pgoptions_alone(
    report: str, ctl: Ctl, run_cli: RunCli, cli_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    assert ctl("fence", report, "--key", cli_env["LOCK_KEY"]).returncode == 0
    env = {
        **cli_env,
        "LOCK_STRATEGY": "lease",
        "LOCK_FENCING": "1",
        # the job's own options are kept; an outer run's token is not
        "PGOPTIONS": "-c statement_timeout=4321 -c dislock.fencing_token=999",
    }
    done = run_cli(["DATABASE_URL", sys.executable, "-c", WRITER.format(table=report)], env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "4321ms"
    written = db.execute(sql.SQL("SELECT body FROM {}").format(sql.SQL(report))).fetchall()
    token = db.execute(
        sql.SQL("SELECT fence FROM {} WHERE key = %s").format(sql.SQL(cli_env["LOCK_TABLE"])),
        (f"cronjob-lock:lease:{cli_env['LOCK_KEY']}",),
    ).fetchone()
    assert token is not None and written == [(str(token[0]),)]

    # The same command without LOCK_FENCING carries no token: its write is refused.
    refused = run_cli(
        ["DATABASE_URL", sys.executable, "-c", WRITER.format(table=report)],
        {**env, "LOCK_FENCING": "0"},
    )
    assert refused.returncode == 1
    assert "dislock fencing refused this INSERT" in refused.stderr


def test_truncate_is_refused_for_the_owner_and_in_replica_mode(
    report: str, ctl: Ctl, cli_env: dict[str, str]
) -> None:
    assert ctl("fence", report, "--key", "nightly").returncode == 0
    with psycopg.connect(cli_env["DATABASE_URL"], autocommit=True) as conn:
        with pytest.raises(psycopg.Error, match="refused this TRUNCATE") as truncated:
            conn.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(report)))
        assert truncated.value.sqlstate == "FENCE"
        conn.execute("SET session_replication_role = replica")  # turns ordinary triggers off
        with pytest.raises(psycopg.Error, match="refused this INSERT"):
            conn.execute(sql.SQL("INSERT INTO {} VALUES ('x')").format(sql.SQL(report)))


def test_print_sql_applied_by_hand_guards_the_table(
    report: str, ctl: Ctl, cli_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    printed = ctl("fence", report, "--key", "nightly", "--print-sql")
    assert printed.returncode == 0, printed.stderr
    assert _write(cli_env["DATABASE_URL"], report) is None  # printed, not run
    db.execute(printed.stdout)
    assert _write(cli_env["DATABASE_URL"], report) is not None
    removal = ctl("unfence", report, "--print-sql")
    db.execute(removal.stdout)
    assert _write(cli_env["DATABASE_URL"], report) is None


def test_fence_refuses_what_cannot_work(
    report: str, ctl: Ctl, lock_table: tuple[str, str], db: psycopg.Connection[Any]
) -> None:
    def refused(*args: str) -> tuple[int, str]:
        done = ctl(*args)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        return done.returncode, done.stderr

    status, err = refused("fence", report, "--key", "k" * 2049)
    assert status == 2 and "2048" in err
    status, err = refused("fence", f"{lock_table[0]}.nothing_here", "--key", "nightly")
    assert (status, err.strip()) == (
        2,
        f"dislockctl: error: table {lock_table[0]}.nothing_here does not exist",
    )
    db.execute(
        sql.SQL("DROP FUNCTION {}()").format(
            sql.Identifier(lock_table[0], "key_value_dislock_fence")
        )
    )
    status, err = refused("fence", report, "--key", "nightly")
    assert status == 2 and "init --fencing" in err
    assert ctl("init", "--fencing").returncode == 0  # puts the guard back
    assert ctl("fence", report, "--key", "nightly").returncode == 0


def test_init_twice_changes_nothing(
    ctl: Ctl, db: psycopg.Connection[Any], lock_table: tuple[str, str]
) -> None:
    assert ctl("init", "--fencing").returncode == 0
    guard = sql.SQL("SELECT xmin::text FROM pg_proc WHERE oid = to_regprocedure(%s)")
    name = f"{lock_table[0]}.key_value_dislock_fence()"
    before = db.execute(guard, (name,)).fetchone()
    again = ctl("init", "--fencing")
    assert again.returncode == 0 and "already exists with fencing" in again.stdout
    assert db.execute(guard, (name,)).fetchone() == before
    # A guard of an older release is rewritten (its functions keep their names).
    db.execute(
        sql.SQL("COMMENT ON FUNCTION {}() IS 'dislock fence guard 0'").format(sql.SQL(name[:-2]))
    )
    upgraded = ctl("init", "--fencing")
    assert upgraded.returncode == 0 and "is ready with fencing tokens" in upgraded.stdout
    comment = db.execute("SELECT obj_description(to_regprocedure(%s), 'pg_proc')", (name,))
    assert comment.fetchone() == (VERSION,)


def test_the_wrapper_gives_no_pgoptions_of_its_own_without_fencing(
    run_cli: RunCli, cli_env: dict[str, str]
) -> None:
    done = run_cli(
        ["DATABASE_URL", sys.executable, "-c", "import os; print(os.environ.get('PGOPTIONS'))"],
        {**cli_env, "LOCK_STRATEGY": "lease", "PGOPTIONS": "-c dislock.fencing_token=7"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"  # an outer run's token is never passed on
