"""The console scripts' exit (``dislock.cli.exit_now``): it skips the interpreter's
teardown but nothing a user or a test harness can see."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import atexit, sys
atexit.register(lambda: print("exit handler ran", file=sys.stderr))
print("written, not yet flushed", end="")
{before}
from dislock.cli import exit_now
exit_now(7)
"""


def run(before: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT.format(before=before)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_status_output_and_exit_handlers_survive() -> None:
    result = run()
    assert result.returncode == 7
    assert result.stdout == "written, not yet flushed"
    assert result.stderr == "exit handler ran\n"


def test_a_closed_stdout_does_not_change_the_status() -> None:
    result = run("sys.stdout.close()")
    assert result.returncode == 7
    assert result.stderr == "exit handler ran\n"


def test_the_console_scripts_end_through_it() -> None:
    """``python -m`` and the installed commands run ``console_main``: a status other
    than 0 reaches the shell, and the output is all there."""
    for module in ("dislock.cli", "dislock.cli.ctl"):
        result = subprocess.run(
            [sys.executable, "-m", module, "--no-such-option-or-variable"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2, (module, result.stderr)
        assert "error" in result.stderr and "Traceback" not in result.stderr


def test_a_guard_still_on_its_way_out_is_let_go_at_exit_without_a_warning() -> None:
    """A Python program that ran a command exits while the command's guard is still
    reading its "done": no ResourceWarning ("subprocess N is still running")."""
    code = (
        "from dislock.core.processes import Guard\n"
        "guard = Guard.start('token')\n"
        "assert guard is not None\n"
        "guard.stand_down()\n"
        "del guard\n"
    )
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
