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

from tests.cli.conftest import DISLOCK

CTL = [sys.executable, "-m", "dislock.cli.ctl"]
LISTENING = re.compile(r"listening on (http://\S+/)")


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
        db.execute(
            sql.SQL("GRANT SELECT ON {} TO {}").format(
                sql.Identifier(schema, table), sql.Identifier(role)
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
