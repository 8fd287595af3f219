"""What the supervisor decides about the command's processes: which still run in a
group (a `/proc/PID/stat` line), and the environment its guard finds them by."""

from __future__ import annotations

import pytest

from dislock.core.supervision import runs_in_group


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"4242 (sh) S 1 77 77 0 -1 4194560\n", True),
        (b"4242 (sleep) R 4241 77 77 0 -1\n", True),
        (b"4242 (sleep) Z 1 77 77 0 -1\n", False),  # exited, awaiting its reaper
        (b"4242 (sleep) X 1 77 77 0 -1\n", False),
        (b"4242 (sh) S 1 78 78 0 -1\n", False),  # another group
        (b"4242 (a) S 1 78 (b) S 1 77 77 0\n", True),  # a name made to mislead
        (b"4242 (a) S 1 77 77 0) S 1 78 78\n", False),
        (b"4242 (truncated) S\n", False),
        (b"", False),
    ],
)
def test_runs_in_group(line: bytes, expected: bool) -> None:
    assert runs_in_group(line, 77) is expected


def test_the_command_carries_a_token_of_its_run_and_its_guard_none() -> None:
    from dislock.core.guard import GUARD_TOKEN_VARIABLE, RUN_TOKEN_VARIABLE
    from dislock.core.supervision import (
        FENCING_TOKEN_VARIABLE,
        child_environment,
        guard_environment,
        new_run_token,
    )

    outer = {"PATH": "/bin", RUN_TOKEN_VARIABLE: "outer", FENCING_TOKEN_VARIABLE: "7"}
    token = new_run_token()
    assert token != new_run_token() and len(token) == 16 and token.isalnum()
    env = child_environment(outer, "job", None, token)
    # A run inside another one: the inner command carries its own run's token only.
    assert env[RUN_TOKEN_VARIABLE] == token and env["DISLOCK_LOCK_KEY"] == "job"
    assert FENCING_TOKEN_VARIABLE not in env and env["PATH"] == "/bin"
    # Its guard carries it under a name of its own, and the outer one not at all: the
    # outer guard, looking for the outer token, must not kill the guard that watches
    # the inner command (nor may a guard look like the command it watches).
    assert guard_environment(outer, token) == {
        "PATH": "/bin",
        FENCING_TOKEN_VARIABLE: "7",
        GUARD_TOKEN_VARIABLE: token,
    }
