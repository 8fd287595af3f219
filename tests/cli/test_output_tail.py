"""The end of a failed run's output, kept in its history row (``LOCK_OUTPUT_TAIL_BYTES``):
the output passes through the wrapper whole, in order and as bytes, and only the
tail, scrubbed of the lock URL's secrets, is stored and shown escaped."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from tests.cli.conftest import DISLOCK, Ctl, RunCli, dislock_on_path, run_pasted
from tests.cli.test_generated_input import with_password
from tests.support.processes import killed_if_left, state


def tail_env(history_env: dict[str, str], limit: int = 100) -> dict[str, str]:
    return {**history_env, "LOCK_STRATEGY": "lease", "LOCK_OUTPUT_TAIL_BYTES": str(limit)}


def last_run(ctl: Ctl, env: dict[str, str]) -> dict[str, Any]:
    runs = json.loads(ctl("history", env["LOCK_KEY"], "--json", env=env).stdout)
    return runs[0]  # type: ignore[no-any-return]


def test_a_failed_runs_tail_is_kept_and_its_output_passed_through_whole(
    ctl: Ctl, history_env: dict[str, str]
) -> None:
    env = tail_env(history_env, 200)
    script = "seq 1 20000; echo 'to stderr' >&2; exit 3"
    result = subprocess.run(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", script], env=env, capture_output=True, timeout=120
    )
    assert result.returncode == 3, result.stderr
    assert result.stdout == b"".join(b"%d\n" % n for n in range(1, 20001))
    assert result.stderr == b"to stderr\n"
    output = last_run(ctl, env)["output"]
    assert output["stdout"].endswith("19999\n20000\n") and len(output["stdout"]) == 200
    assert output["stderr"] == "to stderr\n"
    shown = ctl("history", env["LOCK_KEY"], env=env).stdout
    assert "  stdout, last 20 lines:\n" in shown and "    20000\n" in shown, shown
    assert "  stderr:\n    to stderr" in shown


def test_a_success_keeps_nothing_and_bytes_pass_as_bytes(
    ctl: Ctl, history_env: dict[str, str]
) -> None:
    env = tail_env(history_env)
    binary = "printf 'a\\000b\\377\\033[31mred\\n'"
    ok = subprocess.run(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", binary], env=env, capture_output=True, timeout=60
    )
    assert ok.returncode == 0 and ok.stdout == b"a\x00b\xff\x1b[31mred\n", ok
    assert last_run(ctl, env)["output"] is None
    failed = subprocess.run(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", binary + "; exit 1"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert failed.returncode == 1 and failed.stdout == ok.stdout
    # Stored as text a PostgreSQL text can hold; shown with its escape sequence inert.
    assert last_run(ctl, env)["output"]["stdout"] == "a\\x00b\\xff\x1b[31mred\n"
    shown = ctl("history", env["LOCK_KEY"], env=env).stdout
    assert "\x1b" not in shown and "    a\\x00b\\xff\\x1b[31mred" in shown, shown


def test_a_command_that_closes_its_stdout_early_and_the_url_never_stored(
    ctl: Ctl, history_env: dict[str, str], run_cli: RunCli
) -> None:
    env = tail_env(history_env, 4096)
    script = 'exec >&-; sleep 0.3; echo "connecting to $DATABASE_URL" >&2; exit 1'
    result = run_cli(["DATABASE_URL", "sh", "-c", script], env)
    assert result.returncode == 1 and result.stdout == ""
    url = env["DATABASE_URL"]
    assert f"connecting to {url}" in result.stderr  # its own output is its own
    output = last_run(ctl, env)["output"]
    assert output == {"stdout": None, "stderr": "connecting to ***\n"}


def test_the_password_is_scrubbed_percent_encoded_and_glued_to_other_text(
    ctl: Ctl, history_env: dict[str, str], run_cli: RunCli
) -> None:
    password = "p@ss/w0rd"
    env = {
        **tail_env(history_env),
        "DATABASE_URL": with_password(history_env["DATABASE_URL"], password, "url", ""),
    }
    assert "p%40ss%2Fw0rd@" in env["DATABASE_URL"]  # as the URL writes it
    script = (
        "echo p%40ss%2Fw0rd p%40ss%2fw0rd; echo 'x=p@ss/w0rd;' >&2; echo xxp@ss/w0rdyy >&2; exit 1"
    )
    result = run_cli(["DATABASE_URL", "sh", "-c", script], env)
    assert result.returncode == 1 and result.stdout == "p%40ss%2Fw0rd p%40ss%2fw0rd\n"
    assert last_run(ctl, env)["output"] == {"stdout": "*** ***\n", "stderr": "x=***;\nxx***yy\n"}
    shown = ctl("history", env["LOCK_KEY"], env=env).stdout
    assert "w0rd" not in shown and "    xx***yy" in shown, shown


@pytest.mark.parametrize("source", ["PGPASSWORD", "passfile", "service file"])
def test_a_password_beside_the_url_is_scrubbed(
    ctl: Ctl, history_env: dict[str, str], run_cli: RunCli, tmp_path: Path, source: str
) -> None:
    # The URL has no password; libpq takes one from beside it (the embedded server trusts
    # the test's role, so only the wrapper's scrubbing tells whether it knew the password).
    password = "S3cr/t@pw!"
    url = history_env["DATABASE_URL"]
    assert not conninfo_to_dict(url).get("password")
    env = tail_env(history_env)
    if source == "PGPASSWORD":
        env["PGPASSWORD"] = password
    elif source == "passfile":
        # The line libpq picks for the connection's user, not the one before it.
        with psycopg.connect(url) as conn:
            user = conn.info.user
        passfile = tmp_path / "pgpass"
        passfile.write_text(f"*:*:*:someone-else:other-pw\n*:*:*:{user}:{password}\n")
        passfile.chmod(0o600)
        env["PGPASSFILE"] = str(passfile)
    else:
        services = tmp_path / "services.conf"
        services.write_text(f"[locks]\npassword={password}\n")
        env.update(PGSERVICEFILE=str(services), PGSERVICE="locks")
    encoded = quote(password, safe="")
    script = f"echo 'pw {password}'; echo 'url :{encoded}@' >&2; exit 1"
    result = run_cli(["DATABASE_URL", "sh", "-c", script], env)
    assert result.returncode == 1 and result.stdout == f"pw {password}\n"  # passed through
    assert last_run(ctl, env)["output"] == {"stdout": "pw ***\n", "stderr": "url :***@\n"}


def test_a_tail_needs_the_history_and_a_table_without_its_columns_still_records(
    history_env: dict[str, str], run_cli: RunCli, ctl: Ctl, db: psycopg.Connection[Any]
) -> None:
    bare = {**tail_env(history_env), "LOCK_HISTORY": "0"}
    refused = run_cli(["DATABASE_URL", "false"], bare)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "LOCK_OUTPUT_TAIL_BYTES" in refused.stderr and "LOCK_HISTORY=1" in refused.stderr

    schema, table = history_env["LOCK_TABLE"].split(".")
    db.execute(
        sql.SQL("ALTER TABLE {} DROP COLUMN stdout_tail, DROP COLUMN stderr_tail").format(
            sql.Identifier(schema, f"{table}_history")
        )
    )
    env = tail_env(history_env)
    result = run_cli(["DATABASE_URL", "sh", "-c", "echo boom; exit 4"], env)
    assert result.returncode == 4 and result.stdout == "boom\n"
    (warning,) = [line for line in result.stderr.splitlines() if "no column" in line]
    assert "dislockctl init --history again" in warning, result.stderr
    run = last_run(ctl, env)
    assert run["outcome"] == "failed" and run["exit_code"] == 4 and run["output"] is None
    # init --history brings the table up to date; then the tail is kept again.
    upgraded = ctl("init", "--history", env=env)
    assert upgraded.returncode == 0 and "already exists" not in upgraded.stdout, upgraded.stdout
    assert run_cli(["DATABASE_URL", "sh", "-c", "echo boom; exit 4"], env).returncode == 4
    assert last_run(ctl, env)["output"] == {"stdout": "boom\n", "stderr": None}
    again = ctl("init", "--history", env=env)
    assert "history table" in again.stdout and "already exists" in again.stdout, again.stdout


def test_the_docs_block_runs_as_pasted(history_env: dict[str, str], tmp_path: Path) -> None:
    env = {**history_env, "PATH": dislock_on_path(tmp_path)}
    result = run_pasted("cli.md", "### The end of a failed run's output", env)
    # The command's own output, then the history with its kept end.
    assert result.stdout.startswith("importing 3 files\nSTARTED (UTC)"), result.stdout
    assert result.stderr == "error: disk full\n", result.stderr
    table, kept = result.stdout.split("\n\n")
    assert table.splitlines()[2].endswith("failed (3)")
    assert kept.startswith("output of run ") and "nightly-import on " in kept
    assert kept.endswith(
        "failed (3), started " + kept.split("started ", 1)[1].split(" UTC", 1)[0] + " UTC):\n"
        "  stdout:\n    importing 3 files\n  stderr:\n    error: disk full\n"
    ), kept


def test_a_slow_reader_gets_every_byte_and_a_closed_one_stops_the_command(
    ctl: Ctl, history_env: dict[str, str], tmp_path: Path
) -> None:
    env = tail_env(history_env)
    script = "head -c 300000 /dev/zero; echo END; exit 1"
    with subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", script], env=env, stdout=subprocess.PIPE
    ) as slow:
        assert slow.stdout is not None
        received = b""
        while chunk := slow.stdout.read(65536):
            received += chunk
            time.sleep(0.5)  # longer, in all, than the wait for output that no longer comes
        assert slow.wait(timeout=60) == 1
    assert received == b"\0" * 300000 + b"END\n"
    assert last_run(ctl, env)["output"]["stdout"].endswith("\\x00END\n")

    # `dislock … yes | head -1` ends as it would without the wrapper between: the
    # command's stdout becomes a broken pipe too.
    env = {**env, "PATH": dislock_on_path(tmp_path)}
    piped = subprocess.run(
        ["bash", "-c", "dislock DATABASE_URL yes | head -1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert piped.stdout == "y\n", piped
    assert last_run(ctl, env)["outcome"] in ("killed", "failed")


def test_a_wrapper_started_without_a_stdout_copies_into_no_socket(
    ctl: Ctl, history_env: dict[str, str]
) -> None:
    env = tail_env(history_env)
    result = subprocess.run(
        ["bash", "-c", f"{' '.join(DISLOCK)} DATABASE_URL sh -c 'echo hi; exit 1' >&-"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    run = last_run(ctl, env)
    assert run["outcome"] == "failed" and run["output"]["stdout"] == "hi\n", run


def test_a_success_whose_lease_went_as_it_ended_keeps_its_tail(
    ctl: Ctl, history_env: dict[str, str]
) -> None:
    """The command prints, stops its own wrapper (as a frozen machine would) and
    exits 0; the wrapper, resumed past the lease's deadline, finds its lease gone:
    the run is ``lease_lost`` (exit 75), and its tail is kept like any failed run's
    (before, an ``ok`` end turned ``lease_lost`` as it was recorded kept none)."""
    env = {**tail_env(history_env), "RUN_LOCK_TTL_SECONDS": "2", "LOCK_LEASE_INTERVAL": "0.3"}
    script = 'echo "last words"; echo "said on stderr" >&2; kill -STOP "$PPID"'
    wrapper = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with killed_if_left(wrapper):
        stopped = time.monotonic() + 60
        while state(wrapper.pid) != "T":
            assert time.monotonic() < stopped, "the command never stopped its wrapper"
            time.sleep(0.05)
        time.sleep(3.0)  # past the lease's TTL: its row may be anyone's now
        wrapper.send_signal(signal.SIGCONT)
        stdout, stderr = wrapper.communicate(timeout=60)
    assert wrapper.returncode == 75, stderr
    assert stdout == "last words\n"
    run = last_run(ctl, env)
    assert run["outcome"] == "lease_lost", run
    assert run["output"] == {"stdout": "last words\n", "stderr": "said on stderr\n"}, run
