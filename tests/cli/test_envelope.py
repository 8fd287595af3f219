"""A key's runtime envelope from real runs: ``history`` marks a slow and a short run,
``check`` shows the envelope once ten runs succeeded, ``serve`` flags a run still
going past it, and a real Prometheus scraping ``serve`` raises the docs' alert for
it; and which rows the envelope is learned from."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg import sql

from dislock.cli.runs.envelope import successes_before
from dislock.cli.sending import send
from tests.cli.conftest import Ctl, RunCli, holding
from tests.cli.serving import run_job, sample, serving
from tests.repo.test_alert_rules import as_rule_file, rule_blocks
from tests.support.cluster import free_port
from tests.support.eventually import eventually

LEASE = {"LOCK_STRATEGY": "lease"}
PROMETHEUS = shutil.which("prometheus")


def durations(ctl: Ctl, key: str) -> list[float]:
    return [run["duration_seconds"] for run in json.loads(ctl("history", key, "--json").stdout)]


def test_a_slow_and_a_short_run_are_marked(
    ctl: Ctl, cli_env: dict[str, str], run_cli: RunCli
) -> None:
    assert ctl("init", "--history").returncode == 0
    env = {**cli_env, **LEASE, "LOCK_HISTORY": "1"}
    key = env["LOCK_KEY"]
    for _ in range(9):
        assert run_cli(["DATABASE_URL", "sleep", "0.6"], env).returncode == 0
    assert "runtime" not in ctl("check", env=env).stdout  # nine successes: too few
    assert run_cli(["DATABASE_URL", "sleep", "0.6"], env).returncode == 0
    usual = sorted(durations(ctl, key))
    median = (usual[4] + usual[5]) / 2
    checked = ctl("check", env=env).stdout
    assert f"runtime         median {median:.1f}s, longest {usual[-1]:.1f}s" in checked, checked
    assert "of the last 10 successful runs" in checked

    # Past 3 x the median and past the longest by a clear margin, whatever the machine's pace.
    slow = f"{max(3 * median, usual[-1]) + 0.5:.2f}"
    assert run_cli(["DATABASE_URL", "sleep", slow], env).returncode == 0
    assert run_cli(["DATABASE_URL", "true"], env).returncode == 0

    runs = json.loads(ctl("history", key, "--json").stdout)
    assert [run["envelope"] for run in runs] == ["short", "slow"] + [None] * 10
    table = ctl("history", key).stdout.splitlines()
    assert table[1].endswith("ok, short") and table[2].endswith("ok, slow"), table
    assert all(line.endswith("ok") for line in table[3:13])
    assert table[-1].startswith("slow: longer than 3 x the median")


def test_the_envelope_is_learned_from_the_keys_earlier_successes_only(
    history_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    schema, table = history_env["LOCK_TABLE"].split(".")
    history = (schema, f"{table}_history")
    key = history_env["LOCK_KEY"]
    insert = sql.SQL(
        "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at, ended_at, outcome)"
        " SELECT %s, 'lease', 'o', 'h', 1, t, t + make_interval(secs => %s), %s"
        " FROM (SELECT NOW() - make_interval(mins => %s) AS t) AS at RETURNING started_at"
    ).format(sql.Identifier(*history))

    def recorded(minutes_ago: int, seconds: float, outcome: str = "ok", of: str = key) -> datetime:
        row = db.execute(insert, (of, seconds, outcome, minutes_ago)).fetchone()
        assert row is not None
        started: datetime = row[0]
        return started

    for minute in range(100, 91, -1):  # nine successes of 1 s, then the tenth
        recorded(minute, 1.0)
    tenth = recorded(91, 1.0)
    for minute in range(80, 60, -1):  # failures, another key's runs, later successes
        recorded(minute, 50.0, "failed")
        recorded(minute, 50.0, of=f"{key}-other")
    recorded(30, 7.0)

    def envelope_before(before: datetime | None) -> tuple[float, float, int] | None:
        (found,) = send(db, successes_before(history, [(key, before)]))
        return None if found is None else (found.median, found.longest, found.runs)

    assert envelope_before(tenth) is None  # nine successes before it
    assert envelope_before(recorded(85, 1.0, "failed")) == (1.0, 1.0, 10)
    assert envelope_before(None) == (1.0, 7.0, 11)


def test_serve_flags_a_run_still_going_past_its_envelope(
    history_env: dict[str, str], db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    schema, table = history_env["LOCK_TABLE"].split(".")
    key = history_env["LOCK_KEY"]
    db.execute(
        sql.SQL(
            "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at, ended_at, outcome)"
            " SELECT %s, 'lease', 'o', 'h', 1, t, t + interval '10 ms', 'ok' FROM"
            " generate_series(NOW() - interval '1 hour', NOW() - interval '10 min', '5 min') AS t"
        ).format(sql.Identifier(schema, f"{table}_history")),
        (key,),
    )
    env = {**history_env, **LEASE}
    assert run_job(env, "true").returncode == 0  # its lease row lists the key
    with serving(env) as served:
        assert sample(served.metrics(), "dislock_running_past_envelope", key=key) == 0.0
        with holding(env, tmp_path):
            eventually(
                lambda: sample(served.metrics(), "dislock_running_past_envelope", key=key) == 1.0,
                interval=0.2,
                message="the run past its envelope was not flagged",
            )
            page = served.get("/")[2]
            assert 'data-envelope="slow"' in page and "running past its envelope" in page


def insert_successes(db: psycopg.Connection[Any], env: dict[str, str], seconds: str) -> None:
    """Ten successful runs of ``seconds`` each, five minutes apart, in the key's history."""
    schema, table = env["LOCK_TABLE"].split(".")
    db.execute(
        sql.SQL(
            "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at, ended_at, outcome)"
            " SELECT %s, 'lease', 'o', 'h', 1, t, t + %s::interval, 'ok' FROM"
            " generate_series(NOW() - interval '55 min', NOW() - interval '10 min', '5 min')"
            " AS t"
        ).format(sql.Identifier(schema, f"{table}_history")),
        (env["LOCK_KEY"], seconds),
    )


class Prometheus:
    """A real Prometheus server on a loopback port, asked through its HTTP API."""

    def __init__(self, base: str, process: subprocess.Popen[str], log: Path) -> None:
        self.base = base
        self.process = process
        self.log = log

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of a successful answer to GET /api/v1/``path``."""
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def values(self, query: str) -> dict[str, float]:
        """The ``key`` label and value of each series ``query`` returns now."""
        return {
            found["metric"].get("key", ""): float(found["value"][1])
            for found in self.api("query", query=query)["result"]
        }

    def alerts(self, name: str) -> dict[str, str]:
        """The ``key`` label and state (pending, firing) of each active alert ``name``."""
        return {
            alert["labels"].get("key", ""): alert["state"]
            for alert in self.api("alerts")["alerts"]
            if alert["labels"].get("alertname") == name
        }

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


@contextmanager
def prometheus(tmp_path: Path, target: str, rules: dict[str, Any]) -> Iterator[Prometheus]:
    """``prometheus`` scraping ``target`` (host:port of ``serve``) every second and
    evaluating ``rules`` every second; killed at the end."""
    assert PROMETHEUS is not None
    home = tmp_path / "prometheus"
    home.mkdir()
    (home / "rules.yml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(home / "rules.yml")],
        "scrape_configs": [{"job_name": "dislock", "static_configs": [{"targets": [target]}]}],
    }
    (home / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = home / "prometheus.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={home / 'prometheus.yml'}",
                f"--storage.tsdb.path={home / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            cwd=home,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", process, log)

    def ready() -> bool:
        assert process.poll() is None, f"prometheus exited: {server.tail()}"
        try:
            with urllib.request.urlopen(f"{server.base}/-/ready", timeout=5) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    try:
        eventually(ready, timeout=60, interval=0.2, message=lambda: f"not ready: {server.tail()}")
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


@pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus)"
)
def test_prometheus_raises_the_docs_alert_for_a_run_past_its_envelope(
    history_env: dict[str, str], db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """The docs' DislockRunPastEnvelope rule, as pasted, in a real Prometheus scraping
    ``serve``: quiet while the key's runs are as usual, raised once one runs past them."""
    ((where, text),) = [b for b in rule_blocks() if "DislockRunPastEnvelope" in b[1]]
    rules = as_rule_file(text)
    insert_successes(db, history_env, "600 ms")
    env = {**history_env, **LEASE}
    assert run_job(env, "true").returncode == 0  # its lease row lists the key
    with serving(env) as served:
        target = served.base.removeprefix("http://").rstrip("/")
        assert target.startswith("127.0.0.1:"), served.base  # loopback only
        with prometheus(tmp_path, target, rules) as server:
            raises_the_alert(server, env, tmp_path, where)


def raises_the_alert(server: Prometheus, env: dict[str, str], tmp_path: Path, where: str) -> None:
    """The metric and the alert for ``env``'s key in ``server``: 0 and quiet, then 1 and
    raised (pending or firing) while a run is held past the key's envelope."""
    key = env["LOCK_KEY"]
    past = f'dislock_running_past_envelope{{key="{key}"}}'

    def scraped() -> str:
        return f"up {server.values('up')}, alerts {server.alerts('DislockRunPastEnvelope')}"

    eventually(
        lambda: server.values(past) == {key: 0.0},
        timeout=60,
        interval=0.5,
        message=lambda: f"serve was not scraped: {scraped()} {server.tail()}",
    )
    assert key not in server.alerts("DislockRunPastEnvelope"), where
    with holding(env, tmp_path):
        eventually(
            lambda: server.values(past) == {key: 1.0},
            timeout=60,
            interval=0.5,
            message=lambda: f"the run past its envelope was not scraped: {scraped()}",
        )
        eventually(
            lambda: server.alerts("DislockRunPastEnvelope").get(key) in ("pending", "firing"),
            timeout=60,
            interval=0.5,
            message=lambda: f"{where}: the alert was not raised: {scraped()}",
        )
        raised = server.values('ALERTS{alertname="DislockRunPastEnvelope"}')
        assert raised.get(key) == 1.0, raised
