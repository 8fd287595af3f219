"""``LOCK_GROUP=NAME:N`` in the wrapper: never more than N of the group's runs at
once, whatever each key's strategy, read from what the commands themselves
recorded; refusals, configuration errors, and what ``dislockctl ls`` and
``dislockctl serve`` show."""

from __future__ import annotations

import html
import json
import subprocess
import uuid
from pathlib import Path

import pytest

from dislock.core.bounds import clip
from dislock.core.rows import lease_key
from tests.cli.conftest import (
    DISLOCK,
    UNREACHABLE,
    Ctl,
    RunCli,
    assert_refused_in_one_line,
    dislock_on_path,
    holding,
    run_pasted,
)
from tests.cli.serving import sample, serving
from tests.support.eventually import eventually
from tests.support.rows import Rows

STRATEGIES = ["schedule", "lease", "schedule,lease", "lease"]

# Each command writes its start and end on the one clock of this machine; a run's
# interval is what the group bounds.
RECORD = 'date +%s.%N > "$0.start"; sleep 1; date +%s.%N > "$0.end"'


def most_at_once(records: list[Path]) -> int:
    """The largest number of recorded runs whose intervals overlap at one instant."""
    spans = [
        (float(Path(f"{r}.start").read_text()), float(Path(f"{r}.end").read_text()))
        for r in records
    ]
    return max(sum(1 for start, end in spans if start <= at < end) for at, _ in spans)


def group_env(cli_env: dict[str, str], group: str, strategy: str) -> dict[str, str]:
    """A wrapper of a key of its own, with ``strategy``, in ``group``."""
    return {
        **cli_env,
        "LOCK_KEY": f"job-{uuid.uuid4().hex[:8]}",
        "LOCK_STRATEGY": strategy,
        "LOCK_GROUP": group,
        "CRONJOB_LOCK_LOG_LEVEL": "INFO",
    }


def start_four(cli_env: dict[str, str], tmp_path: Path, **extra: str) -> list[Path]:
    """Four wrappers of four keys in one group of two, started together; their
    records' paths once all have exited (each exit status in ``<record>.status``)."""
    group = f"heavy-{uuid.uuid4().hex[:6]}:2"
    records = [tmp_path / f"run{n}" for n in range(4)]
    processes = [
        subprocess.Popen(
            [*DISLOCK, "DATABASE_URL", "sh", "-c", RECORD, str(record)],
            env={**group_env(cli_env, group, strategy), **extra},
            stderr=subprocess.PIPE,
            text=True,
        )
        for record, strategy in zip(records, STRATEGIES, strict=True)
    ]
    for record, process in zip(records, processes, strict=True):
        _, stderr = process.communicate(timeout=120)
        record.with_suffix(".status").write_text(f"{process.returncode}\n{stderr}")
    return records


def test_four_wrappers_waiting_in_a_group_of_two_all_run_two_at_a_time(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    records = start_four(cli_env, tmp_path, LOCK_WAIT_SECONDS="60")
    for record in records:
        assert record.with_suffix(".status").read_text().startswith("0\n"), record
    assert most_at_once(records) <= 2
    assert most_at_once(records) >= 1


def test_four_wrappers_not_waiting_never_run_more_than_two(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    records = start_four(cli_env, tmp_path, LOCK_CONFLICT_EXIT_CODE="3")
    ran = [r for r in records if Path(f"{r}.start").exists()]
    for record in records:
        status, _, stderr = record.with_suffix(".status").read_text().partition("\n")
        if record in ran:
            assert status == "0", stderr
        else:
            assert status == "3", stderr
            assert "group 'heavy-" in stderr and "is full" in stderr
    assert len(ran) >= 1 and most_at_once(ran) <= 2


def test_a_run_refused_by_a_full_group_leaves_its_schedule_slot_open(
    cli_env: dict[str, str], run_cli: RunCli, ctl: Ctl, tmp_path: Path
) -> None:
    group = f"heavy-{uuid.uuid4().hex[:6]}:1"
    marker = tmp_path / "ran"
    env = {**group_env(cli_env, group, "schedule"), "LOCK_CONFLICT_EXIT_CODE": "3"}
    short = {"RUN_LOCK_TTL_SECONDS": "2", "LOCK_LEASE_INTERVAL": "0.3"}
    (tmp_path / "holder").mkdir()
    with holding({**group_env(cli_env, group, "lease"), **short}, tmp_path / "holder"):
        listed = ctl("ls")
        assert f"group {group.split(':')[0]!r}: 1 held (by " in listed.stdout, listed.stdout
        refused = run_cli(["DATABASE_URL", "touch", str(marker)], env)
        assert refused.returncode == 3, refused.stderr
        assert f"group {group.split(':')[0]!r} is full" in refused.stderr
        assert not marker.exists()
    # The holder is gone (killed: its group slot expires by its TTL, which the
    # wrapper waits out); the same slot of the same key now starts.
    ran = run_cli(["DATABASE_URL", "touch", str(marker)], {**env, "LOCK_WAIT_SECONDS": "60"})
    assert ran.returncode == 0, ran.stderr
    assert marker.exists()


def test_the_status_page_shows_a_group_held_by_its_holder_escaped(
    history_env: dict[str, str], ctl: Ctl, tmp_path: Path
) -> None:
    name = f"<script>alert(1)</script>-{uuid.uuid4().hex[:6]}"
    env = group_env(history_env, f"{name}:2", "lease")
    with holding(env, tmp_path), serving(history_env) as served:
        listed = json.loads(ctl("ls", "--json", env=history_env).stdout)
        _, _, page = served.get("/")
        metrics = served.metrics()
    (owner,) = [row["owner"] for row in listed if row["mode"] == "group" and row["held"]]
    assert "<script>" not in page
    section = page[page.index('<table id="groups">') :]
    row = section[section.index(f'data-group="{html.escape(name)}"') :].split("</tr>", 1)[0]
    assert 'data-held="1"' in row and ">1 held<" in row, row
    assert f"&lt;script&gt;alert(1)&lt;/script&gt;-{name[-6:]}" in row
    assert html.escape(clip(owner)) in row  # clipped like every owner on the page
    # The key's own row is still there, its run running; the group is no key of it.
    assert f'data-key="{env["LOCK_KEY"]}" data-state="running"' in page
    assert f'data-key="{html.escape(name)}"' not in page
    assert sample(metrics, "dislock_group_held", group=name) == 1.0


def test_ls_and_the_page_tell_a_run_waiting_for_its_group_from_one_running(
    history_env: dict[str, str], ctl: Ctl, run_cli: RunCli, rows: Rows, tmp_path: Path
) -> None:
    group = f"heavy-{uuid.uuid4().hex[:6]}:1"
    runner = group_env(history_env, group, "lease")
    waiter = {**group_env(history_env, group, "lease"), "LOCK_WAIT_SECONDS": "600"}
    # The waiter's key has run before: its history records its runs.
    assert run_cli(["DATABASE_URL", "true"], waiter).returncode == 0
    with holding(runner, tmp_path):
        waiting = subprocess.Popen(
            [*DISLOCK, "DATABASE_URL", "true"], env=waiter, stderr=subprocess.DEVNULL
        )
        try:
            # Its lease taken, it waits for the group's one slot.
            eventually(lambda: _held(rows, lease_key(waiter["LOCK_KEY"])), timeout=60)
            listed = ctl("ls", env=history_env).stdout
            states = json.loads(ctl("ls", "--json", env=history_env).stdout)
            with serving(history_env) as served:
                page = served.get("/")[2]
        finally:
            waiting.kill()
            waiting.wait(timeout=30)
    line = {row.split()[0]: row for row in listed.splitlines()[1:]}
    assert line[waiter["LOCK_KEY"]].endswith("  waiting for group"), listed
    assert line[runner["LOCK_KEY"]].endswith("  running"), listed
    activity = {row["lock_key"]: (row["state"], row["activity"]) for row in states}
    assert activity[waiter["LOCK_KEY"]] == ("held", "waiting for group")  # state as before
    assert activity[runner["LOCK_KEY"]] == ("held", "running")
    assert f'data-key="{waiter["LOCK_KEY"]}" data-state="waiting for group"' in page
    assert f'data-key="{runner["LOCK_KEY"]}" data-state="running"' in page


def _held(rows: Rows, key: str) -> bool:
    found = rows.get(key)
    return found is not None and not found.expired


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("heavy", "LOCK_GROUP must be NAME:N"),
        ("heavy:0", "LOCK_GROUP's N"),
        ("heavy:1001", "LOCK_GROUP's N"),
        (":2", "LOCK_GROUP's NAME"),
        ("heavy:two", "LOCK_GROUP's N"),
        ("h" * 201 + ":2", "LOCK_GROUP's NAME"),
    ],
)
def test_a_bad_group_is_a_configuration_error(
    run_cli: RunCli, cli_env: dict[str, str], tmp_path: Path, value: str, expected: str
) -> None:
    marker = tmp_path / "ran"
    env = {**cli_env, "DATABASE_URL": UNREACHABLE, "LOCK_GROUP": value}
    result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert_refused_in_one_line(result, expected, marker)


def test_the_docs_heavy_jobs_block_runs_two_at_a_time(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**cli_env, "PATH": dislock_on_path(tmp_path)}
    result = run_pasted("cli.md", "## A group of jobs, N at a time", env)
    assert result.returncode == 0, result.stderr
    running, most = 0, 0
    for line in result.stdout.splitlines():  # the order the three printed in
        running += 1 if line.endswith(" start") else -1
        most = max(most, running)
    assert sorted(result.stdout.split()) == sorted(
        ["reindex", "vacuum", "export"] * 2 + ["start"] * 3 + ["end"] * 3
    )
    assert 1 <= most <= 2  # never three at once
