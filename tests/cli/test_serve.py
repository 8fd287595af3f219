"""``dislockctl serve`` against a real PostgreSQL: metrics, status page, bad input, shutdown."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from dislock.core.history import create_history
from dislock.core.pause import pause_params, pause_statement
from tests.cli.conftest import DISLOCK, wait_for

CTL = [sys.executable, "-m", "dislock.cli.ctl"]
LISTENING = re.compile(r"listening on (http://\S+/)")


@pytest.fixture
def cli_env(cli_env: dict[str, str], db: psycopg.Connection[Any]) -> dict[str, str]:
    """The wrapper's environment with run history on, its table created."""
    schema, table = cli_env["LOCK_TABLE"].split(".")
    for statement in create_history((schema, f"{table}_history")):
        db.execute(statement)
    return {**cli_env, "LOCK_HISTORY": "1"}


@dataclass
class Served:
    base: str
    process: subprocess.Popen[str]
    log: list[str] = field(default_factory=list)

    def get(self, path: str) -> tuple[int, str, str]:
        """Status, content type and body of GET ``path``."""
        try:
            with urllib.request.urlopen(self.base + path.lstrip("/"), timeout=30) as answer:
                return answer.status, answer.headers["Content-Type"], answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics, parsed back by prometheus_client: (name, labels) -> value."""
        status, kind, body = self.get("/metrics")
        assert status == 200 and kind.startswith("text/plain"), (status, kind)
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body)
            for sample in family.samples
        }


@contextmanager
def serving(env: dict[str, str], *args: str) -> Iterator[Served]:
    """``dislockctl DATABASE_URL serve`` on a free loopback port, stopped by SIGTERM at the
    end, which must exit 0."""
    process = subprocess.Popen(
        [*CTL, "DATABASE_URL", "serve", "--listen", "127.0.0.1:0", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    served = Served("", process)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            served.log.append(line)
            found = LISTENING.search(line)
            if found:
                served.base = found.group(1)
                break
        assert served.base, f"serve did not start: {''.join(served.log)}"
        yield served
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
        served.log += [out, err]
    assert process.returncode == 0, "".join(served.log)


def run_job(
    env: dict[str, str], *command: str, **overrides: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DISLOCK, "DATABASE_URL", *command],
        env={**env, **overrides},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def sample(
    metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float | None:
    return metrics.get((name, tuple(sorted(labels.items()))))


def test_lock_rows_become_metrics_and_page_rows(cli_env: dict[str, str]) -> None:
    key = cli_env["LOCK_KEY"]
    lease_key = f"{key}-lease"
    assert run_job(cli_env, "true").returncode == 0  # schedule: held until the slot ends
    assert run_job(cli_env, "true", LOCK_KEY=lease_key, LOCK_STRATEGY="lease").returncode == 0
    with serving(cli_env) as served:
        metrics = served.metrics()
        assert sample(metrics, "dislock_up") == 1.0
        assert sample(metrics, "dislock_lock_held", key=key, mode="schedule") == 1.0
        # A lease let go at the end of its run is no longer held.
        assert sample(metrics, "dislock_lock_held", key=lease_key, mode="lease") == 0.0

        status, kind, page = served.get("/")
        assert status == 200 and kind == "text/html; charset=utf-8"
        assert f'data-key="{key}" data-state="held"' in page
        assert f'data-key="{lease_key}"' in page
        assert '<meta http-equiv="refresh"' in page
        assert served.get("/healthz")[:2] == (200, "text/plain; charset=utf-8")
        assert served.get("/nowhere")[0] == 404


def test_serve_only_reads_and_leaks_no_password(
    cli_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    """A role that may only SELECT is enough, and the URL's password shows nowhere."""
    role = f"ro_{uuid.uuid4().hex[:8]}"
    password = f"pw{uuid.uuid4().hex}"
    schema, table = cli_env["LOCK_TABLE"].split(".")
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
        assert run_job(cli_env, "true").returncode == 0
        params = conninfo_to_dict(cli_env["DATABASE_URL"])
        params.update(user=role, password=password)
        url = make_conninfo("", **params)
        env = {**cli_env, "DATABASE_URL": url}
        with serving(env) as served:
            answers = [served.get(path)[2] for path in ("/", "/metrics", "/healthz", "/x")]
            metrics = served.metrics()
        assert sample(metrics, "dislock_up") == 1.0
        assert sample(metrics, "dislock_lock_held", key=cli_env["LOCK_KEY"], mode="schedule") == 1.0
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


def test_a_database_that_does_not_answer_is_up_0_not_a_crash(cli_env: dict[str, str]) -> None:
    password = f"pw{uuid.uuid4().hex}"
    url = f"postgresql://someone:{password}@127.0.0.1:{closed_port()}/nothing"
    with serving({**cli_env, "DATABASE_URL": url}) as served:
        metrics = served.metrics()
        status, _, page = served.get("/")
        assert served.get("/healthz")[0] == 200
    assert sample(metrics, "dislock_up") == 0.0
    assert not [name for name, _ in metrics if name != "dislock_up"]
    assert status == 200 and 'id="down"' in page
    log = "".join(served.log)
    assert "the database did not answer: cannot connect" in log
    for text in (page, log, *map(str, metrics)):
        assert password not in text and url not in text


def test_sigint_also_stops_it_cleanly(cli_env: dict[str, str]) -> None:
    with serving(cli_env) as served:
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
    cli_env: dict[str, str], listen: str, says: str
) -> None:
    result = subprocess.run(
        [*CTL, "DATABASE_URL", "serve", "--listen", listen],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_port_in_use_is_one_line_and_exit_1(cli_env: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*CTL, "DATABASE_URL", "serve", "--listen", f"127.0.0.1:{port}"],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1, result.stderr
    assert (
        result.stderr
        == f"dislockctl: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    )


def test_a_missing_lock_table_is_one_line_and_exit_1(cli_env: dict[str, str]) -> None:
    env = {**cli_env, "LOCK_TABLE": f"nowhere_{uuid.uuid4().hex[:8]}.locks"}
    result = subprocess.run(
        [*CTL, "DATABASE_URL", "serve", "--listen", "127.0.0.1:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and "does not exist" in result.stderr


def test_a_missing_history_table_is_one_line_and_exit_1(cli_env: dict[str, str]) -> None:
    env = {**cli_env, "LOCK_HISTORY_TABLE": f"nowhere_{uuid.uuid4().hex[:8]}"}
    result = subprocess.run(
        [*CTL, "DATABASE_URL", "serve", "--listen", "127.0.0.1:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "history table" in result.stderr and "init --history" in result.stderr


@dataclass
class Fleet:
    """Lock keys that went through real runs, one per outcome."""

    ok: str
    failed: str
    lost: str
    abandoned: str
    paused: str
    missed: str
    missed_expected: range


def ctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CTL, "DATABASE_URL", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def make_fleet(env: dict[str, str], db: psycopg.Connection[Any], tmp: Any) -> Fleet:
    base = env["LOCK_KEY"]
    fleet = Fleet(
        ok=f"{base}-ok",
        failed=f"{base}-failed",
        lost=f"{base}-lost",
        abandoned=f"{base}-abandoned",
        paused=f"{base}-paused",
        missed=f"{base}-missed",
        missed_expected=range(0),
    )
    lease = {"LOCK_STRATEGY": "lease", "RUN_LOCK_TTL_SECONDS": "3", "LOCK_LEASE_INTERVAL": "1"}

    assert run_job(env, "true", LOCK_KEY=fleet.ok, **lease).returncode == 0
    assert run_job(env, "sh", "-c", "exit 3", LOCK_KEY=fleet.failed, **lease).returncode == 3

    # Lost: an operator force-releases the lease while the command runs.
    started = tmp / "lost-started"
    holder = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", f"touch {started}; sleep 60"],
        env={**env, "LOCK_KEY": fleet.lost, **lease},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(started)
    assert ctl({**env, "LOCK_KEY": fleet.lost}, "release", fleet.lost).returncode == 0
    assert holder.wait(timeout=60) == 75

    # Abandoned: the wrapper dies (SIGKILL) and its lease runs out.
    started = tmp / "abandoned-started"
    doomed = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", f"touch {started}; sleep 60"],
        env={**env, "LOCK_KEY": fleet.abandoned, **lease},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(started)
    doomed.kill()
    doomed.wait(timeout=30)

    # Paused: it ran once, then an operator paused it; the next start is skipped.
    assert run_job(env, "true", LOCK_KEY=fleet.paused, **lease).returncode == 0
    schema, table = env["LOCK_TABLE"].split(".")
    db.execute(
        pause_statement((schema, table), for_interval=True),
        pause_params(fleet.paused, "disk <full> & slow", seconds=3600),
    )
    skipped = run_job(env, "sh", "-c", "echo ran", LOCK_KEY=fleet.paused, **lease)
    assert skipped.returncode == 0 and skipped.stdout == ""

    # Missed: a run every minute, and then none for ten minutes (its run moved back
    # in time, the way the clock would have moved on).
    every_minute = {"LOCK_STRATEGY": "schedule", "CRON_SCHEDULE": "* * * * *"}
    assert run_job(env, "true", LOCK_KEY=fleet.missed, **every_minute).returncode == 0
    history = sql.Identifier(schema, f"{table}_history")
    shifted = db.execute(
        sql.SQL(
            "UPDATE {} SET started_at = started_at - interval '10 minutes',"
            " ended_at = ended_at - interval '10 minutes',"
            " slot_end = slot_end - interval '10 minutes'"
            " WHERE lock_key = %s RETURNING slot_end, NOW()"
        ).format(history),
        (fleet.missed,),
    ).fetchone()
    assert shifted is not None
    slot_end, now = shifted
    # Every minute from the end of its slot to a minute (the grace) before now began
    # a slot that nobody started; the scrape comes a little later, hence a range.
    first = int((now.timestamp() - 60 - slot_end.timestamp()) // 60) + 1
    fleet.missed_expected = range(first, first + 2)
    time.sleep(3.5)  # the abandoned lease (TTL 3 s) runs out
    return fleet


def test_real_runs_become_metrics(
    cli_env: dict[str, str], db: psycopg.Connection[Any], tmp_path: Any
) -> None:
    fleet = make_fleet(cli_env, db, tmp_path)
    schema, table = cli_env["LOCK_TABLE"].split(".")
    history = sql.Identifier(schema, f"{table}_history")
    recorded = {
        key: (started.timestamp(), ended.timestamp() if ended else None)
        for key, started, ended in db.execute(
            sql.SQL("SELECT lock_key, started_at, ended_at FROM {}").format(history)
        )
    }
    with serving(cli_env) as served:
        first = served.metrics()
        # One more success after the first scrape: the counter moves on from there.
        lease = {"LOCK_STRATEGY": "lease", "RUN_LOCK_TTL_SECONDS": "3"}
        assert run_job(cli_env, "true", LOCK_KEY=fleet.ok, **lease).returncode == 0
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

    assert sample(first, "dislock_missed_slots", key=fleet.missed) in fleet.missed_expected
    assert sample(first, "dislock_missed_slots", key=fleet.ok) is None  # no schedule

    assert sample(first, "dislock_lock_held", key=fleet.ok, mode="lease") == 0.0
    assert sample(first, "dislock_lock_held", key=fleet.abandoned, mode="lease") == 0.0
