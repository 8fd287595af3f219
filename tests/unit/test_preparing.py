"""When a shared connection starts preparing statements (``dislock.core.preparing``)."""

from __future__ import annotations

import pytest

from dislock.core.preparing import CHECK_AFTER, PREPARE_THRESHOLD, Preparation, prepare_threshold


def test_a_connection_is_checked_once_after_its_first_statements() -> None:
    preparation = Preparation()
    due = [preparation.check_due() for _ in range(3 * CHECK_AFTER)]
    assert due.index(True) == CHECK_AFTER - 1  # before its CHECK_AFTER-th statement
    assert due.count(True) == 1


def test_a_one_shot_run_is_never_checked() -> None:
    """The wrapper's run: acquisitions, releases and history writes, fewer than CHECK_AFTER."""
    preparation = Preparation()
    assert not any(preparation.check_due() for _ in range(CHECK_AFTER - 1))


def test_only_the_server_process_the_startup_announced_prepares() -> None:
    assert prepare_threshold(4242, 4242) == PREPARE_THRESHOLD
    # PgBouncer announces a process id of its own making.
    assert prepare_threshold(1_958_392_011, 4242) is None


@pytest.mark.parametrize("answer", [None, "4242", 4242.0, True])
def test_an_unexpected_answer_never_prepares(answer: object) -> None:
    assert prepare_threshold(4242, answer) is None
    assert prepare_threshold(1, True) is None
