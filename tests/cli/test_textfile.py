"""``DISLOCK_METRICS_TEXTFILE``: the wrapper's own runs in a node_exporter textfile."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.cli.conftest import DISLOCK
from tests.cli.serving import Metrics, ctl, run_job, sample
from tests.support.eventually import wait_for


def read(path: Path) -> Metrics:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(path.read_text())
        for sample in family.samples
    }


def test_runs_land_in_the_file(cli_env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "dislock.prom"
    env = {**cli_env, "DISLOCK_METRICS_TEXTFILE": str(path), "LOCK_STRATEGY": "lease"}
    key, other = env["LOCK_KEY"], f"{env['LOCK_KEY']}-other"

    before = time.time()
    assert run_job(env, "true").returncode == 0
    first = read(path)
    success = sample(first, "dislock_last_success_timestamp_seconds", key=key)
    assert success is not None and before <= success <= time.time()
    assert sample(first, "dislock_runs_total", key=key, outcome="ok") == 1.0
    assert sample(first, "dislock_runs_total", key=key, outcome="failed") == 0.0

    assert run_job(env, "sh", "-c", "sleep 0.3; exit 3").returncode == 3
    assert run_job(env, "true", LOCK_KEY=other).returncode == 0
    after = read(path)
    assert sample(after, "dislock_runs_total", key=key, outcome="ok") == 1.0
    assert sample(after, "dislock_runs_total", key=key, outcome="failed") == 1.0
    # The failure does not erase when it last succeeded; it is the latest start.
    assert sample(after, "dislock_last_success_timestamp_seconds", key=key) == success
    start = sample(after, "dislock_last_start_timestamp_seconds", key=key)
    assert start is not None and start > success
    duration = sample(after, "dislock_last_run_duration_seconds", key=key)
    assert duration is not None and 0.3 <= duration < 30
    assert sample(after, "dislock_runs_total", key=other, outcome="ok") == 1.0
    # Only the file and its lock are left: the temporary file was renamed into place.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dislock.prom", "dislock.prom.lock"]


def test_a_skipped_start_writes_nothing(cli_env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "dislock.prom"
    env = {**cli_env, "DISLOCK_METRICS_TEXTFILE": str(path)}  # schedule: once a slot
    assert run_job(env, "true").returncode == 0
    written = path.read_text()
    assert run_job(env, "true").returncode == 0  # the slot is taken: skipped
    assert path.read_text() == written


def test_jobs_ending_together_all_land(cli_env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "dislock.prom"
    env = {**cli_env, "DISLOCK_METRICS_TEXTFILE": str(path), "LOCK_STRATEGY": "lease"}
    keys = [f"{env['LOCK_KEY']}-{n}" for n in range(6)]
    jobs = [
        subprocess.Popen(
            [*DISLOCK, "DATABASE_URL", "true"],
            env={**env, "LOCK_KEY": key},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for key in keys
    ]
    assert [job.wait(timeout=120) for job in jobs] == [0] * len(keys)
    metrics = read(path)
    assert [sample(metrics, "dislock_runs_total", key=key, outcome="ok") for key in keys] == [
        1.0
    ] * len(keys)


def test_an_unwritable_file_never_changes_the_exit_status(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "missing-dir" / "dislock.prom"
    env = {**cli_env, "DISLOCK_METRICS_TEXTFILE": str(path), "LOCK_STRATEGY": "lease"}
    result = run_job(env, "sh", "-c", "exit 4")
    assert result.returncode == 4
    assert f"could not write the metrics file {path}" in result.stderr
    assert result.stderr.count("\n") == 1
    assert not path.parent.exists()


def test_a_lost_lease_is_recorded_as_such(cli_env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "dislock.prom"
    env = {**cli_env, "DISLOCK_METRICS_TEXTFILE": str(path), "LOCK_STRATEGY": "lease"}
    # The command outlives a lease an operator takes away from it.
    started = tmp_path / "started"
    holder = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", f"touch {started}; sleep 60"],
        env={**env, "RUN_LOCK_TTL_SECONDS": "3", "LOCK_LEASE_INTERVAL": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(started)
    assert ctl(env, "release", env["LOCK_KEY"]).returncode == 0
    assert holder.wait(timeout=60) == 75
    metrics = read(path)
    assert sample(metrics, "dislock_runs_total", key=env["LOCK_KEY"], outcome="lease_lost") == 1.0
    assert sample(metrics, "dislock_last_success_timestamp_seconds", key=env["LOCK_KEY"]) is None
