"""Reading a ``/proc/PID/stat`` line: which processes still run in a group."""

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
