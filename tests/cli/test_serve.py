"""``dislockctl serve`` against a real PostgreSQL: metrics, status page, bad input, shutdown."""

from __future__ import annotations

import signal
import socket
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.cli.serving import ctl, make_fleet, run_job, sample, serving


def test_lock_rows_become_metrics_and_page_rows(history_env: dict[str, str]) -> None:
    key = history_env["LOCK_KEY"]
    lease_key = f"{key}-lease"
    assert run_job(history_env, "true").returncode == 0  # schedule: held until the slot ends
    assert run_job(history_env, "true", LOCK_KEY=lease_key, LOCK_STRATEGY="lease").returncode == 0
    zoned = f"{key}-zoned"
    assert run_job(history_env, "true", LOCK_KEY=zoned, CRON_TZ="Asia/Kolkata").returncode == 0
    with serving(history_env) as served:
        metrics = served.metrics()
        assert sample(metrics, "dislock_up") == 1.0
        assert sample(metrics, "dislock_lock_held", key=key, mode="schedule") == 1.0
        # A lease let go at the end of its run is no longer held.
        assert sample(metrics, "dislock_lock_held", key=lease_key, mode="lease") == 0.0

        status, kind, page = served.get("/")
        assert status == 200 and kind == "text/html; charset=utf-8"
        # Its run is over: its schedule slot is only taken, until the slot ends.
        assert f'data-key="{key}" data-state="slot taken"' in page
        assert f'data-key="{lease_key}"' in page
        assert '<meta http-equiv="refresh"' in page
        # The next slot is read in the zone the run recorded: new year in India is
        # 18:30 UTC the day before.
        row = page[page.index(f'data-key="{zoned}"') :].split("</tr>", 1)[0]
        assert "18:30:00 UTC" in row and "(Asia/Kolkata)" in row
        assert served.get("/healthz")[:2] == (200, "text/plain; charset=utf-8")
        assert served.get("/nowhere")[0] == 404


def test_serve_only_reads_and_leaks_no_password(
    history_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    """A role that may only SELECT is enough, and the URL's password shows nowhere."""
    role = f"ro_{uuid.uuid4().hex[:8]}"
    password = f"pw{uuid.uuid4().hex}"
    schema, table = history_env["LOCK_TABLE"].split(".")
    db.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)
        )
    )
    try:
        db.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(schema), sql.Identifier(role)
            )
        )
        for name in (table, f"{table}_history"):
            db.execute(
                sql.SQL("GRANT SELECT ON {} TO {}").format(
                    sql.Identifier(schema, name), sql.Identifier(role)
                )
            )
        assert run_job(history_env, "true").returncode == 0
        params = conninfo_to_dict(history_env["DATABASE_URL"])
        params.update(user=role, password=password)
        url = make_conninfo("", **params)
        env = {**history_env, "DATABASE_URL": url}
        with serving(env) as served:
            answers = [served.get(path)[2] for path in ("/", "/metrics", "/healthz", "/x")]
            metrics = served.metrics()
        assert sample(metrics, "dislock_up") == 1.0
        assert (
            sample(metrics, "dislock_lock_held", key=history_env["LOCK_KEY"], mode="schedule")
            == 1.0
        )
        for text in [*answers, *served.log]:
            assert password not in text
            assert url not in text
    finally:
        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_database_that_does_not_answer_is_up_0_not_a_crash(history_env: dict[str, str]) -> None:
    password = f"pw{uuid.uuid4().hex}"
    url = f"postgresql://someone:{password}@127.0.0.1:{closed_port()}/nothing"
    with serving({**history_env, "DATABASE_URL": url}) as served:
        metrics = served.metrics()
        status, _, page = served.get("/")
        assert served.get("/healthz")[0] == 200
    assert sample(metrics, "dislock_up") == 0.0
    assert not [name for name, _ in metrics if name != "dislock_up"]
    assert status == 200 and 'id="down"' in page
    # Which log: the reason is dislockctl serve's line below, not the PostgreSQL server's.
    assert "dislockctl serve logged why on its standard error" in page
    log = "".join(served.log)
    assert "the database did not answer: cannot connect" in log
    assert "Connection refused. Is the server running" in log  # libpq's two lines, joined
    for text in (page, log, *map(str, metrics)):
        assert password not in text and url not in text


def test_sigint_also_stops_it_cleanly(history_env: dict[str, str]) -> None:
    with serving(history_env) as served:
        assert served.get("/healthz")[0] == 200
        served.process.send_signal(signal.SIGINT)
        assert served.process.wait(timeout=30) == 0


@pytest.mark.parametrize(
    ("listen", "says"),
    [
        ("nonsense", "expected HOST:PORT"),
        (":9655", "has no host"),
        ("127.0.0.1:99999", "from 0 to 65535"),
        ("127.0.0.1:http", "from 0 to 65535"),
        ("[::1:9655", "expected [IPV6]:PORT"),
        ("::1:9655", "in brackets"),
        ("no-such-host.invalid:9655", "--listen 'no-such-host.invalid:9655'"),
    ],
)
def test_a_bad_listen_address_is_one_line_and_exit_2(
    history_env: dict[str, str], listen: str, says: str
) -> None:
    result = ctl(history_env, "serve", "--listen", listen)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_port_in_use_is_one_line_and_exit_1(history_env: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = ctl(history_env, "serve", "--listen", f"127.0.0.1:{port}")
    assert result.returncode == 1, result.stderr
    assert (
        result.stderr
        == f"dislockctl: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    )


def test_a_missing_lock_table_is_one_line_and_exit_1(history_env: dict[str, str]) -> None:
    env = {**history_env, "LOCK_TABLE": f"nowhere_{uuid.uuid4().hex[:8]}.locks"}
    result = ctl(env, "serve", "--listen", "127.0.0.1:0")
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and "does not exist" in result.stderr


def test_a_missing_history_table_is_one_line_and_exit_1(history_env: dict[str, str]) -> None:
    env = {**history_env, "LOCK_HISTORY_TABLE": f"nowhere_{uuid.uuid4().hex[:8]}"}
    result = ctl(env, "serve", "--listen", "127.0.0.1:0")
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "history table" in result.stderr and "init --history" in result.stderr


def test_real_runs_become_metrics(
    history_env: dict[str, str], db: psycopg.Connection[Any], tmp_path: Any
) -> None:
    fleet = make_fleet(history_env, db, tmp_path)
    schema, table = history_env["LOCK_TABLE"].split(".")
    history = sql.Identifier(schema, f"{table}_history")
    recorded = {
        key: (started.timestamp(), ended.timestamp() if ended else None)
        for key, started, ended in db.execute(
            sql.SQL("SELECT lock_key, started_at, ended_at FROM {}").format(history)
        )
    }
    with serving(history_env) as served:
        first = served.metrics()
        scraped_by = db.execute("SELECT NOW()").fetchone()
        # One more success after the first scrape: the counter moves on from there.
        lease = {"LOCK_STRATEGY": "lease", "RUN_LOCK_TTL_SECONDS": "3"}
        ok = {**lease, "LOCK_KEY": fleet.ok, "CRON_SCHEDULE": ""}
        assert run_job(history_env, "true", **ok).returncode == 0
        second = served.metrics()

    assert sample(first, "dislock_up") == 1.0
    expected_runs = {
        fleet.ok: "ok",
        fleet.failed: "failed",
        fleet.lost: "lease_lost",
        fleet.paused: "ok",
        fleet.missed: "ok",
    }
    for key, outcome in expected_runs.items():
        for other in ("ok", "failed", "lease_lost", "killed"):
            count = sample(first, "dislock_runs_total", key=key, outcome=other)
            assert count == (1.0 if other == outcome else 0.0), (key, other, count)
        assert sample(first, "dislock_last_start_timestamp_seconds", key=key) == pytest.approx(
            recorded[key][0]
        )
        duration = sample(first, "dislock_last_run_duration_seconds", key=key)
        assert duration is not None and 0 <= duration < 60
    assert sample(second, "dislock_runs_total", key=fleet.ok, outcome="ok") == 2.0

    # The abandoned run never ended: counted nowhere, its start still shown.
    for outcome in ("ok", "failed", "lease_lost", "killed"):
        assert sample(first, "dislock_runs_total", key=fleet.abandoned, outcome=outcome) == 0.0
    assert sample(first, "dislock_last_start_timestamp_seconds", key=fleet.abandoned) is not None
    assert sample(first, "dislock_last_run_duration_seconds", key=fleet.abandoned) is None

    assert sample(first, "dislock_last_success_timestamp_seconds", key=fleet.ok) == pytest.approx(
        recorded[fleet.ok][1]
    )
    for key in (fleet.failed, fleet.lost, fleet.abandoned):
        assert sample(first, "dislock_last_success_timestamp_seconds", key=key) is None

    assert sample(first, "dislock_paused", key=fleet.paused) == 1.0
    assert sample(first, "dislock_paused", key=fleet.ok) == 0.0

    assert scraped_by is not None
    missed = sample(first, "dislock_missed_slots", key=fleet.missed)
    assert missed in fleet.missed_expected(scraped_by[0]), missed
    assert sample(first, "dislock_missed_slots", key=fleet.ok) is None  # no schedule
    # A yearly schedule (the environment's CRON_SCHEDULE) began no slot in the window.
    assert sample(first, "dislock_missed_slots", key=fleet.failed) == 0.0

    assert sample(first, "dislock_lock_held", key=fleet.ok, mode="lease") == 0.0
    assert sample(first, "dislock_lock_held", key=fleet.abandoned, mode="lease") == 0.0
