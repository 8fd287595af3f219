"""Bad configuration: exit 2 before anything runs, with one line naming the culprit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import dislock
import dislock.cli.wrapper.command
from tests.cli.conftest import DISLOCK, UNREACHABLE, RunCli, assert_refused_in_one_line


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"LOCK_KEY": None}, "LOCK_KEY is unset or empty"),
        ({"LOCK_KEY": "  "}, "LOCK_KEY is unset or empty"),
        ({"LOCK_STRATEGY": "mutex"}, "LOCK_STRATEGY='mutex'"),
        ({"LOCK_STRATEGY": "schedule,"}, "LOCK_STRATEGY='schedule,'"),
        ({"CRON_SCHEDULE": None}, "CRON_SCHEDULE is unset or empty"),
        ({"CRON_SCHEDULE": "61 * * * *"}, "CRON_SCHEDULE is not a valid cron expression: '61"),
        ({"CRON_SCHEDULE": "daily"}, "CRON_SCHEDULE is not a valid cron expression: 'daily'"),
        ({"CRON_SCHEDULE": "0 0 30 2 *"}, "CRON_SCHEDULE never fires: '0 0 30 2 *'"),
        ({"CRON_TZ": "Mars/Olympus"}, "CRON_TZ='Mars/Olympus' is not a known IANA time zone"),
        ({"CRON_TZ": None, "TZ": "Nowhere/Else"}, "TZ='Nowhere/Else' is not a known IANA"),
        ({"LOCK_STRATEGY": "lease", "RUN_LOCK_TTL_SECONDS": "abc"}, "RUN_LOCK_TTL_SECONDS"),
        ({"LOCK_STRATEGY": "lease", "RUN_LOCK_TTL_SECONDS": "0"}, "at least 0.1 s, got '0'"),
        ({"LOCK_STRATEGY": "lease", "RUN_LOCK_TTL_SECONDS": "-5"}, "at least 0.1 s, got '-5'"),
        # The table (#18): each refused in one line naming the largest value.
        (
            {"LOCK_STRATEGY": "lease", "RUN_LOCK_TTL_SECONDS": "1e12"},
            "RUN_LOCK_TTL_SECONDS must be at most 604800 s, got '1e12'",
        ),
        (
            {"LOCK_STRATEGY": "lease", "LOCK_LEASE_INTERVAL": "1e12"},
            "LOCK_LEASE_INTERVAL must be at most 604800 s, got '1e12'",
        ),
        ({"LOCK_JITTER_SECONDS": "1e9"}, "LOCK_JITTER_SECONDS must be at most 3600 s, got '1e9'"),
        (
            {"CRON_SCHEDULE": "*/5 * * * *", "LOCK_JITTER_SECONDS": "200"},
            "LOCK_JITTER_SECONDS (200 s) must be at most half the shortest interval between the "
            "fires of CRON_SCHEDULE (300 s), so at most 150 s",
        ),
        ({"LOCK_KEY": "k" * 3000}, "LOCK_KEY is 3000 bytes long; at most 2048 bytes"),
        ({"LOCK_KEY": "é" * 1025}, "LOCK_KEY is 2050 bytes long"),
        ({"LOCK_KEY": "two\nlines"}, "LOCK_KEY must not contain control or invisible characters"),
        ({"LOCK_KEY": "tab\tbed"}, "(found '\\t' in 'tab\\tbed')"),
        ({"LOCK_KEY": "rtl\u202eyek"}, "found '\\u202e'"),
        ({"LOCK_TABLE": "lock\ntable"}, "contains control or invisible characters"),
        ({"LOCK_TABLE": "kv%s"}, "table name part 'kv%s' contains '%'"),
        ({"LOCK_STRATEGY": "lease", "RUN_LOCK_TTL_SECONDS": "nan"}, "finite"),
        ({"LOCK_STRATEGY": "lease", "LOCK_LEASE_INTERVAL": "61"}, "LOCK_LEASE_INTERVAL (61 s)"),
        ({"LOCK_STRATEGY": "lease", "LOCK_LEASE_INTERVAL": "x"}, "LOCK_LEASE_INTERVAL"),
        ({"LOCK_STRATEGY": "lease", "RUN_LOCK_TTL_SECONDS": "0.5"}, "set LOCK_LEASE_INTERVAL"),
        ({"LOCK_JITTER_SECONDS": "abc"}, "LOCK_JITTER_SECONDS must be a number"),
        ({"LOCK_JITTER_SECONDS": "-1"}, "LOCK_JITTER_SECONDS must not be negative, got '-1'"),
        ({"LOCK_ON_LEASE_LOSS": "ignore"}, "LOCK_ON_LEASE_LOSS must be 'terminate' or 'continue'"),
        ({"LOCK_TABLE": "a.b.c"}, "LOCK_TABLE='a.b.c'"),
        ({"LOCK_FENCING": "maybe"}, "LOCK_FENCING must be one of"),
        ({"LOCK_PASS_URL": "never"}, "LOCK_PASS_URL must be one of 1/true/yes/on or 0/false"),
        (
            {"LOCK_CONNECT_PATIENCE_SECONDS": "-1"},
            "LOCK_CONNECT_PATIENCE_SECONDS must not be negative, got '-1'",
        ),
        (
            {"LOCK_CONNECT_PATIENCE_SECONDS": "soon"},
            "LOCK_CONNECT_PATIENCE_SECONDS must be a number",
        ),
        (
            {"DATABASE_URL": None},
            "DATABASE_URL is unset or empty (or set but not exported: a file read with `.`"
            " needs `set -a` before its lines)",
        ),
        # A misspelled setting: LOCK_RETRYS would run without retries (#62).
        ({"LOCK_RETRYS": "2"}, "LOCK_RETRYS is not a dislock setting: did you mean LOCK_RETRIES?"),
        (
            {"LOCK_MAX_RUNTIME_SECOND": "60", "LOCK_FILE": "/tmp/x"},
            "LOCK_MAX_RUNTIME_SECOND is not a dislock setting: did you mean"
            " LOCK_MAX_RUNTIME_SECONDS?",
        ),
        ({"DATABASE_URL": ""}, "DATABASE_URL is unset or empty"),
        ({"DATABASE_URL": "postgresql//app:hunter2-secret@x"}, "DATABASE_URL: database URL"),
        (
            {"DATABASE_URL": "postgresql://app:hunter2-secret@127.0.0.1:notaport/app"},
            "DATABASE_URL: database URL's port is not a number from 1 to 65535",
        ),
        (
            {"DATABASE_URL": "postgresql://app:hunter2-secret@h1:5432,h2:99999/app"},
            "DATABASE_URL: database URL's port is not a number from 1 to 65535",
        ),
    ],
)
def test_bad_variable_exits_2_without_running_the_command(
    run_cli: RunCli,
    cli_env: dict[str, str],
    tmp_path: Path,
    overrides: dict[str, str | None],
    expected: str,
) -> None:
    env = {**cli_env, "DATABASE_URL": UNREACHABLE}
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    marker = tmp_path / "ran"
    result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert_refused_in_one_line(result, expected, marker)


def test_a_name_like_a_setting_but_far_from_each_is_a_warning_and_the_command_runs(
    run_cli: RunCli, cli_env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    env = {**cli_env, "LOCK_FILE": "/var/run/other-tool.lock"}
    result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert result.returncode == 0, result.stderr
    assert marker.exists()
    assert result.stderr == "dislock: LOCK_FILE is not a dislock setting: ignored\n"


def test_the_url_variable_and_what_dislock_sets_for_its_command_are_no_settings(
    run_cli: RunCli, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """A URL variable named like a setting (``LOCK_KEYS``, a typo of LOCK_KEY's
    otherwise), and a wrapper run by a wrapper, whose environment holds
    ``DISLOCK_LOCK_KEY``, ``DISLOCK_RUN_TOKEN`` and ``DISLOCK_ATTEMPT``: no word."""
    env = {**cli_env, "LOCK_KEYS": cli_env["DATABASE_URL"]}
    marker = tmp_path / "inner-ran"
    inner = f'LOCK_KEY="$DISLOCK_LOCK_KEY-in" {" ".join(DISLOCK)} LOCK_KEYS touch "{marker}"'
    result = run_cli(
        ["LOCK_KEYS", "sh", "-c", f"env | grep -q ^DISLOCK_RUN_TOKEN= && {inner}"], env
    )
    assert result.returncode == 0, result.stderr
    assert marker.exists()
    assert result.stderr == ""


def test_a_url_in_a_file_read_without_set_a_is_told_so(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    """The hint of an unset URL variable, followed: the same file with ``set -a``."""
    env = {name: value for name, value in cli_env.items() if name != "DATABASE_URL"}
    jobs = tmp_path / "jobs.env"
    jobs.write_text(f"DATABASE_URL={cli_env['DATABASE_URL']}\n")
    line = f'. "{jobs}" && {sys.executable} -m dislock.cli DATABASE_URL true'
    unexported = subprocess.run(["sh", "-c", line], env=env, capture_output=True, text=True)
    assert unexported.returncode == 2
    assert "or set but not exported: a file read with `.` needs `set -a`" in unexported.stderr
    jobs.write_text(f"set -a\n{jobs.read_text()}")
    exported = subprocess.run(["sh", "-c", line], env=env, capture_output=True, text=True)
    assert exported.returncode == 0, exported.stderr


def test_check_lists_the_unknown_variables_and_fails(
    cli_env: dict[str, str],
) -> None:
    from tests.cli.conftest import CTL

    def check(**extra: str) -> subprocess.CompletedProcess[str]:
        env = {**cli_env, **extra}
        return subprocess.run(
            [*CTL, "DATABASE_URL", "check"], env=env, capture_output=True, text=True, timeout=60
        )

    typo_and_other = check(LOCK_RETRYS="2", CRON_MAILTO="ops@example.com")
    assert typo_and_other.returncode == 2
    assert typo_and_other.stderr == (
        "dislockctl: warning: CRON_MAILTO is not a dislock setting: ignored\n"
        "dislockctl: error: LOCK_RETRYS is not a dislock setting: did you mean LOCK_RETRIES?\n"
    )
    other = check(CRON_MAILTO="ops@example.com")
    assert other.returncode == 2
    assert other.stderr == "dislockctl: warning: CRON_MAILTO is not a dislock setting: ignored\n"
    assert other.stdout.startswith(
        "configuration is valid but for the variables named above, which no run reads\n"
    )
    clean = check()
    assert clean.returncode == 0, clean.stderr
    assert clean.stdout.startswith("configuration is valid\n")


def test_url_given_instead_of_its_variable_is_refused_without_echoing_it(
    run_cli: RunCli, cli_env: dict[str, str]
) -> None:
    result = run_cli([UNREACHABLE, "true"], cli_env)
    assert result.returncode == 2
    assert "NAME of an environment variable" in result.stderr
    assert "hunter2" not in result.stderr


@pytest.mark.parametrize("args", [[], ["DATABASE_URL"]])
def test_missing_arguments_exit_2(
    run_cli: RunCli, cli_env: dict[str, str], args: list[str]
) -> None:
    result = run_cli(args, cli_env)
    assert result.returncode == 2
    assert "usage: dislock" in result.stderr or "no command" in result.stderr


def test_unknown_log_level_falls_back_to_warning_with_a_warning(
    run_cli: RunCli, cli_env: dict[str, str]
) -> None:
    env = {**cli_env, "CRONJOB_LOCK_LOG_LEVEL": "loud"}
    result = run_cli(["DATABASE_URL", "true"], env)
    assert result.returncode == 0, result.stderr
    assert "CRONJOB_LOCK_LOG_LEVEL='loud'" in result.stderr
    assert "using WARNING" in result.stderr


def test_help_documents_every_variable_and_exit_code(
    run_cli: RunCli, cli_env: dict[str, str]
) -> None:
    result = run_cli(["--help"], cli_env)
    assert result.returncode == 0
    for word in (
        "LOCK_KEY",
        "LOCK_STRATEGY",
        "CRON_SCHEDULE",
        "LOCK_TABLE",
        "RUN_LOCK_TTL_SECONDS",
        "LOCK_LEASE_INTERVAL",
        "LOCK_JITTER_SECONDS",
        "LOCK_ON_LEASE_LOSS",
        "LOCK_FENCING",
        "LOCK_PASS_URL",
        "LOCK_CONNECT_PATIENCE_SECONDS",
        "LOCK_WAIT_SECONDS",
        "LOCK_WAIT_POLL_SECONDS",
        "LOCK_WAIT_LISTEN",
        "LOCK_SLOTS",
        "LOCK_CONFLICT_EXIT_CODE",
        "LOCK_HISTORY",
        "LOCK_HISTORY_TABLE",
        "CRON_TZ",
        "DISLOCK_METRICS_TEXTFILE",
        "CRONJOB_LOCK_LOG_LEVEL",
        "75",
        "128+n",
    ):
        assert word in result.stdout


def test_version(run_cli: RunCli, cli_env: dict[str, str]) -> None:
    result = run_cli(["--version"], cli_env)
    assert result.returncode == 0
    assert result.stdout.strip() == f"dislock-cli {dislock.cli.__version__}"
    assert dislock.cli.__version__ == dislock.__version__


def test_lease_only_run_imports_neither_croniter_nor_aio(cli_env: dict[str, str]) -> None:
    code = (
        "import sys\n"
        "from dislock.cli.wrapper.command import main\n"
        "status = main(['DATABASE_URL', 'true'])\n"
        "assert status == 0, status\n"
        "loaded = [m for m in sys.modules if m.startswith(('croniter', 'dislock.aio'))]\n"
        "assert not loaded, loaded\n"
    )
    env = {**cli_env, "LOCK_STRATEGY": "lease"}
    env.pop("CRON_SCHEDULE")
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
