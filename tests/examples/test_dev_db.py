"""``hatch run dev-db``: a local server that stays up for dislockctl, until Ctrl-C deletes it.

The lines its banner prints for a second terminal (docs/getting-started.md shows the same
ones) are run as printed, in a shell, each after the ``export`` lines before it: every one
must exit 0 and print what it should. ``hatch run NAME`` is run as ``NAME`` from this test's
own environment (the same editable workspace as hatch's default environment), after checking
that ``NAME`` is a script of that environment or a command one of its members installs.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from datetime import datetime
from pathlib import Path

import psycopg

from dislock.core.variables import VARIABLES

ROOT = Path(__file__).resolve().parents[2]
GETTING_STARTED = ROOT / "docs" / "getting-started.md"

# What each command the banner gives must print, by the command without its variables and
# without `hatch run`; a banner line missing here fails, so that it is run and checked too.
EXPECTED = {
    "dislockctl DATABASE_URL init --history": (
        "lock table key_value is ready\n"
        "history table key_value_history is ready: set LOCK_HISTORY=1 to record runs\n"
    ),
    "dislockctl DATABASE_URL ls": "no locks in key_value\n",
    "dislock DATABASE_URL echo hello": "hello\n",
}
RUN_AGAIN = "dislock DATABASE_URL echo hello"
"""The command the docs say to run again within the same minute: it then prints nothing."""


def banner_commands(printed: str) -> list[str]:
    """The lines the banner gives to paste: indented, after "In another terminal", up to
    the first blank line."""
    found = re.search(r"^In another terminal[^\n]*\n((?:  \S[^\n]*\n)+)", printed, flags=re.M)
    assert found, printed
    return [line.strip() for line in found.group(1).splitlines()]


def documented_commands() -> list[str]:
    """The ```bash block of docs/getting-started.md that shows the banner's lines."""
    page = GETTING_STARTED.read_text()
    for block in re.findall(r"^```bash\n(.*?)^```$", page, flags=re.M | re.S):
        if "export DATABASE_URL=" in block:
            return [line.strip() for line in block.splitlines() if line.strip()]
    raise AssertionError("docs/getting-started.md shows no `export DATABASE_URL=` block")


def hatch_runnable() -> set[str]:
    """What `hatch run NAME` can start in the default environment: its scripts and the
    commands its workspace members install."""
    config = tomllib.loads((ROOT / "hatch.toml").read_text())["envs"]["default"]
    names = set(config.get("scripts", {}))
    for member in config["workspace"]["members"]:
        project = tomllib.loads((ROOT / member / "pyproject.toml").read_text())["project"]
        names |= set(project.get("scripts", {}))
    return names


def without_hatch(line: str) -> tuple[str, str]:
    """The line to run here (``hatch run `` dropped) and the command it runs, without the
    variables set in front of it (the key of ``EXPECTED``)."""
    words = shlex.split(line)
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0], flags=re.S):
        words.pop(0)
    if words[:2] == ["hatch", "run"]:
        assert words[2] in hatch_runnable(), f"`hatch run {words[2]}` starts nothing: {line}"
        words = words[2:]
        line = line.replace("hatch run ", "", 1)
    return line, " ".join(words)


def a_fresh_terminal() -> dict[str, str]:
    """This environment without any variable dislock reads (as a user's new terminal has
    none of them), with this test environment's commands first on PATH."""
    dropped = {variable.name for variable in VARIABLES} | {"DATABASE_URL"}
    env = {name: value for name, value in os.environ.items() if name not in dropped}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def database_minute(url: str) -> datetime:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT date_trunc('minute', now())").fetchone()
    assert row is not None
    minute: datetime = row[0]
    return minute


def paste(exports: list[str], line: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``line`` run in a shell that has run the ``export`` lines before it."""
    return subprocess.run(
        ["bash", "-c", "\n".join([*exports, line])],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def run_pasted(commands: list[str], url: str) -> None:
    """Each command as the user would paste it, checked against ``EXPECTED``."""
    exports = [line for line in commands if line.startswith("export ")]
    assert exports == [f"export DATABASE_URL='{url}'"], commands
    env = a_fresh_terminal()
    ran: set[str] = set()
    for line in commands:
        if line.startswith("export "):
            continue
        runnable, command = without_hatch(line)
        assert command in EXPECTED, f"the banner gives {line!r}: add what it prints to EXPECTED"
        minute = database_minute(url)
        result = paste(exports, runnable, env)
        assert result.returncode == 0, f"{line}\nexit {result.returncode}\n{result.stderr}"
        assert EXPECTED[command] in result.stdout, (line, result.stdout, result.stderr)
        ran.add(command)
        if command == RUN_AGAIN:
            assert result.stdout == EXPECTED[command], (line, result.stdout, result.stderr)
            # The docs: run again within the same minute, it prints nothing and exits 0.
            again = paste(exports, runnable, env)
            assert again.returncode == 0, f"{line}, again\n{again.stderr}"
            if database_minute(url) == minute:  # else the second run had a slot of its own
                assert again.stdout == "", (line, again.stdout, again.stderr)
    assert ran == set(EXPECTED), f"the banner no longer gives {set(EXPECTED) - ran}"


def test_dev_db_prints_commands_that_run_as_printed_and_stops_on_ctrl_c() -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "examples.dev_db"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        printed = []
        deadline = time.monotonic() + 120
        for line in server.stdout:  # until it says how to stop it
            printed.append(line)
            if "Ctrl-C" in line or time.monotonic() > deadline:
                break
        text = "".join(printed)
        found = re.search(r"^  export DATABASE_URL='([^']+)'$", text, flags=re.M)
        assert found, text
        url = found.group(1)

        commands = banner_commands(text)
        # docs/getting-started.md shows the same lines, the server's directory elided.
        elided = [re.sub(r"dislock-pg-[^/]+/", "dislock-pg-…/", line) for line in commands]
        assert documented_commands() == elided, "docs/getting-started.md and the banner differ"

        run_pasted(commands, url)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT to_regclass('key_value')").fetchone() == ("key_value",)

        server.send_signal(signal.SIGINT)  # what Ctrl-C in its terminal sends
        rest = server.communicate(timeout=60)[0]
        assert server.returncode == 0, rest
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    data = re.search(r"host=(/\S+)", url)
    assert data, url
    assert not Path(data.group(1)).exists(), "the server's data outlived it"
