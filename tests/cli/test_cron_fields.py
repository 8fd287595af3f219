"""The CLI on six-field schedules: a seconds-first one is refused in one line (exit
2), and ``dislockctl check`` shows the next fires of ``CRON_SCHEDULE``."""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise
from pathlib import Path

from tests.cli.conftest import Ctl, RunCli, assert_refused_in_one_line


def test_the_wrapper_refuses_a_seconds_first_schedule(
    run_cli: RunCli, cli_env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    env = {**cli_env, "CRON_SCHEDULE": "*/10 * * * * *"}
    result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert_refused_in_one_line(result, "write '* * * * * */10'", marker)


def test_the_wrapper_names_the_field_out_of_range(
    run_cli: RunCli, cli_env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    env = {**cli_env, "CRON_SCHEDULE": "60 * * * *"}
    result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert_refused_in_one_line(
        result,
        "CRON_SCHEDULE is not a valid cron expression: '60 * * * *'"
        " (minute field '60' is out of range 0-59)",
        marker,
    )


def test_check_refuses_it_too(ctl: Ctl, cli_env: dict[str, str]) -> None:
    result = ctl("check", env={**cli_env, "CRON_SCHEDULE": "0 */5 * * * *"})
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "every second of each matching minute" in line and "'*/5 * * * * 0'" in line


def test_check_prints_the_next_three_fires(ctl: Ctl, cli_env: dict[str, str]) -> None:
    env = {**cli_env, "CRON_SCHEDULE": "30 4 * * *", "CRON_TZ": "Europe/Berlin"}
    result = ctl("check", env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("  next fires"))
    fires = [datetime.fromisoformat(line.split()[-1]) for line in lines[first : first + 3]]
    assert all((fire.hour, fire.minute, fire.second) == (4, 30, 0) for fire in fires)
    assert [(b.date() - a.date()).days for a, b in pairwise(fires)] == [1, 1]
    slot_line = next(line for line in lines if line.startswith("  slot ends"))
    assert datetime.fromisoformat(slot_line.split()[2]) in fires[:2]  # the next fire, in UTC


def test_check_fires_odd_dated_mondays_only(ctl: Ctl, cli_env: dict[str, str]) -> None:
    """Day-of-month starts with ``*``: cron fires on days matching both day fields
    (issue #62), and so do the fires ``check`` lists, whatever today is."""
    env = {**cli_env, "CRON_SCHEDULE": "0 0 */2 * MON", "CRON_TZ": "Europe/Berlin"}
    result = ctl("check", env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("  next fires"))
    fires = [datetime.fromisoformat(line.split()[-1]) for line in lines[first : first + 3]]
    assert [(fire.strftime("%a"), fire.day % 2, fire.hour) for fire in fires] == [("Mon", 1, 0)] * 3
    assert all(1 <= (later - earlier).days <= 28 for earlier, later in pairwise(fires))
    slot_line = next(line for line in lines if line.startswith("  slot ends"))
    assert datetime.fromisoformat(slot_line.split()[2]) in fires[:2]
