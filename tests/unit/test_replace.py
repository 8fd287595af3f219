"""Replacing a running holder (``dislock.core.replace_marks``, the replacer's side of
``dislock.core.lease_acquisition``): the marks, the answers, and the sequences,
followed without a database.  The same paths run against PostgreSQL in
``contract/test_replace.py`` and ``cli/test_replace.py``."""

from __future__ import annotations

import logging
import socket
from typing import Any

import psycopg.errors
import pytest

from dislock.core.answers import Acquired
from dislock.core.errors import KeyNotGrantedError, LockPausedError
from dislock.core.lease_acquisition import marking, releasing, replacing, taking_over
from dislock.core.lease_clock import LeaseClock, LeaseSettings
from dislock.core.patience import ConnectPatience
from dislock.core.renewal import Renewal, explain, gone
from dislock.core.replace_marks import (
    REPLACED_MARK,
    Marked,
    handed,
    mark,
    replaced_by,
    successor,
)
from tests.unit.test_acquisition import TAKEN, Database, Late, lease_context, lease_sent

KEY = "cronjob-lock:lease:nightly"
REPLACER = "web-4:77:0badc0de"


def replacer_sent(text: str = REPLACER) -> dict[str, dict[str, Any]]:
    """What a replacer's statements are sent with: its mark (for ``text``, the
    successor it names), the row handed over to it, its own lease's."""
    mark_for = {"key": KEY, "mark": f"{REPLACED_MARK}{text})"}
    return {
        **lease_sent(lease_context(owner=REPLACER)),
        "mark": mark_for,
        "take over": {"key": KEY, "owner": REPLACER, "successor": handed(REPLACER), "ttl": 30.0},
        "withdraw": {**mark_for, "handed": handed(REPLACER)},
    }


@pytest.mark.parametrize(
    ("owner", "host", "text"),
    [
        ("web-3:4242:9f3a0c1e", "web-3", "web-3:4242:9f3a0c1e"),
        ("nightly-import", "web-3", "nightly-import on web-3"),
        # A host that merely starts the owner is not its host part.
        ("web-30:1:aa", "web-3", "web-30:1:aa on web-3"),
    ],
)
def test_the_successor_names_its_host_once(owner: str, host: str, text: str) -> None:
    assert successor(owner, host) == text


@pytest.mark.parametrize(
    "owner",
    ["web-3:4242:9f3a0c1e", "odd (owner)", f"owner{REPLACED_MARK}someone)", "with ) inside"],
)
def test_a_marked_value_names_its_successor_whatever_the_owner(owner: str) -> None:
    text = "web-4:77:0badc0de"
    assert replaced_by(owner, f"{owner}{REPLACED_MARK}{text})") == text


@pytest.mark.parametrize(
    "value",
    [
        None,
        "web-3:4242:9f3a0c1e",  # still the holder's: released, renewed
        "web-3:4242:9f3a0c1e (released)",
        "someone-else (replaced by web-4:1:aa)",  # another owner's row
        "web-3:4242:9f3a0c1e (replaced by web-4:1:aa",  # cut short
    ],
)
def test_anything_else_is_no_replacement(value: str | None) -> None:
    assert replaced_by("web-3:4242:9f3a0c1e", value) is None


def test_the_mark_names_the_successor_and_only_marks_an_unmarked_row() -> None:
    exchange = mark(("locks",), KEY, "web-4:77:0badc0de")
    assert exchange.params["mark"] == " (replaced by web-4:77:0badc0de)"
    assert exchange.params["marked"] == REPLACED_MARK
    assert exchange.params["handed"] == " (handed over)"  # nor a row being handed over
    assert exchange.read([]) is None
    assert exchange.read([("web-3:1:aa", 4.5)]) == Marked("web-3:1:aa", 4.5)
    # A row past its expiry by the time the statement ran reads as none left.
    assert exchange.read([("web-3:1:aa", -0.01)]) == Marked("web-3:1:aa", 0.0)


def _renewal(owner: str, *, lost_by: str) -> Renewal:
    settings = LeaseSettings.from_context(lease_context(owner=owner))
    clock = LeaseClock(settings, acquired_at=100.0)
    if lost_by == "row":
        clock.renewed(sent_at=101.0, now=101.1, rows=0)
    else:
        clock.check_deadline(1000.0)
    return Renewal(key=f"k-{owner}", owner=owner, table_parts=("locks",), clock=clock)


def test_a_loss_is_named_a_replacement_only_when_its_row_was_marked_for_it() -> None:
    replaced = _renewal("a:1:aa", lost_by="row")
    taken = _renewal("b:2:bb", lost_by="row")
    late = _renewal("c:3:cc", lost_by="deadline")
    assert gone([replaced, taken, late]) == [replaced, taken]
    explain(
        [replaced, taken, late],
        {
            "k-a:1:aa": "a:1:aa (replaced by web-4:77:0badc0de)",
            "k-b:2:bb": "other:9:ff",  # taken over after it expired: not a replacement
            "k-c:3:cc": "c:3:cc (replaced by web-4:77:0badc0de)",
        },
    )
    assert replaced.clock.lost_reason == "replaced by web-4:77:0badc0de"
    assert replaced.clock.replaced_by == "web-4:77:0badc0de"
    assert taken.clock.lost_reason is not None and "no longer ours" in taken.clock.lost_reason
    assert taken.clock.replaced_by is None
    # Only a replacement cuts the command's grace short (the row stays live for the
    # replacer); a row found gone and never read since might be one.
    assert replaced.clock.replacing and not taken.clock.replacing and not late.clock.replacing
    assert _renewal("d:4:dd", lost_by="row").clock.replacing
    # A deadline that passed is the loss, whatever the row says by then.
    assert late.clock.lost_reason is not None and "deadline" in late.clock.lost_reason
    assert late.clock.replaced_by is None


def test_marking_returns_what_it_wrote_and_who_held_the_row() -> None:
    context = lease_context(owner="web-4:77:0badc0de")
    named = successor(context.owner, socket.gethostname())  # (its host named)
    db = Database([Marked("web-3:1:aa", 4.0)], replacer_sent(named))
    text, marked = db.run(marking(context, KEY, 1.0, ConnectPatience(5.0, 0.0)))
    assert db.steps == ["mark"]
    assert marked == Marked("web-3:1:aa", 4.0)
    assert text == named


def test_marking_a_key_the_role_may_not_run_is_refused_as_its_acquisition_is() -> None:
    context = lease_context()
    denied = psycopg.errors.InsufficientPrivilege("new row violates row-level security policy")
    db = Database([denied], replacer_sent(successor(context.owner, socket.gethostname())))
    with pytest.raises(KeyNotGrantedError):
        db.run(marking(context, KEY, 1.0, ConnectPatience(5.0, 0.0)))


def _taking(db: Database) -> object:
    context = lease_context(owner="web-4:77:0badc0de")
    settings = LeaseSettings.from_context(context)
    return db.run(
        taking_over(
            context, settings, ConnectPatience(5.0, 0.0), "web-4:77:0badc0de", given=db.given
        )
    )


def test_taking_over_a_handed_row_starts_the_lease_clock_as_the_statement_is_sent() -> None:
    db = Database([TAKEN], replacer_sent(), now=[50.0])
    tried = _taking(db)
    assert db.steps == ["connect", "take over", "noted 3"]
    assert tried is not None and tried.fence == 7  # type: ignore[attr-defined]
    assert tried.clock.deadline == pytest.approx(50.0 + 30.0 - 1.0)  # type: ignore[attr-defined]


def test_a_row_not_handed_over_yet_is_not_taken() -> None:
    db = Database([Acquired(False, None, None, None)], replacer_sent())
    assert _taking(db) is None
    assert db.steps == ["connect", "take over", "noted None"]


def test_a_pause_that_came_meanwhile_refuses_the_take_over() -> None:
    from datetime import datetime, timezone

    until = datetime(2026, 12, 4, 13, 0, tzinfo=timezone.utc)
    db = Database([Acquired(False, None, "maintenance", until)], replacer_sent())
    with pytest.raises(LockPausedError):
        _taking(db)


def test_a_take_over_answered_past_the_lease_deadline_is_released() -> None:
    db = Database([Late(40.0, TAKEN), True], replacer_sent())
    assert _taking(db) is None
    assert db.steps == ["connect", "take over", "noted 3", "release"]


def _replacing(db: Database, remaining: float = 1.0) -> object:
    context = lease_context(owner="web-4:77:0badc0de")
    settings = LeaseSettings.from_context(context)
    marked = Marked("web-3:1:aa", remaining)  # the holder's row expires in 1 s
    patience = ConnectPatience(5.0, 0.0)
    return db.run(
        replacing(context, settings, patience, "web-4:77:0badc0de", marked, given=db.given)
    )


NOT_HANDED = Acquired(False, None, None, None)


def test_a_replacer_takes_the_row_as_soon_as_it_is_handed_over() -> None:
    db = Database([NOT_HANDED, NOT_HANDED, TAKEN], replacer_sent())
    tried = _replacing(db)
    assert tried is not None and tried.fence == 7  # type: ignore[attr-defined]
    take_over, free = ["connect", "take over", "noted None"], ["connect", "crowded?", "acquire"]
    assert db.steps == [*take_over, *free, "noted None", "pause", *take_over[:2], "noted 3"]


def test_a_replacer_takes_a_row_that_expired_unhanded_as_any_acquisition_would() -> None:
    db = Database([NOT_HANDED, TAKEN], replacer_sent())
    tried = _replacing(db)
    assert tried is not None and tried.clock is not None  # type: ignore[attr-defined]
    assert db.steps == [
        "connect",
        "take over",
        "noted None",
        "connect",
        "crowded?",
        "acquire",
        "noted 3",
    ]


def test_a_replacer_gives_up_past_the_rows_expiry_and_withdraws_its_mark() -> None:
    # Each answer comes 0.5 s after its statement; the row's 1 s and 1 s of slack are
    # over after the second round of tries (at 2.2 s), with one poll's pause between.
    db = Database([Late(0.5, NOT_HANDED)] * 4 + [True], replacer_sent())
    tried = _replacing(db)
    assert tried is not None and tried.clock is None  # type: ignore[attr-defined]
    take_over, free = ["connect", "take over", "noted None"], ["connect", "crowded?", "acquire"]
    rounds = [*take_over, *free, "noted None"]
    assert db.steps == [*rounds, "pause", *rounds, "withdraw"]
    assert db.now[0] == pytest.approx(2.2)
    assert db.replies == []


@pytest.mark.parametrize(("remaining", "rounds", "gave_up_at"), [(0.0, 1, 1.0), (0.05, 2, 2.05)])
def test_a_replacer_waits_no_longer_than_the_rows_expiry_and_its_slack(
    remaining: float, rounds: int, gave_up_at: float
) -> None:
    """A round of tries takes 1 s here: one that ends just as the row's time and 1 s
    of slack are over is the last; one that ends 0.05 s before pauses that long only."""
    db = Database([Late(0.5, NOT_HANDED)] * 2 * rounds + [True], replacer_sent())
    _replacing(db, remaining)
    assert db.steps.count("withdraw") == 1 and db.steps.count("pause") == rounds - 1
    assert db.now[0] == pytest.approx(gave_up_at)


def test_a_release_that_found_the_row_marked_hands_it_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    context = lease_context(owner="web-3:1:aa")
    sent = {
        "release": {"key": KEY, "owner": "web-3:1:aa"},
        "hand over": {"key": KEY, "prefix": f"web-3:1:aa{REPLACED_MARK}"},
    }
    db = Database([False, "web-4:77:0badc0de"], sent)
    with caplog.at_level(logging.INFO, logger="dislock"):
        assert db.run(releasing(context, KEY, 30.0)) is True
        assert f"handed lease {KEY} over to web-4:77:0badc0de" in caplog.text
        caplog.clear()
        db = Database([False, None], sent)  # not marked after all: expired, or taken
        assert db.run(releasing(context, KEY, 30.0)) is True
    assert "handed lease" not in caplog.text
    assert db.steps == ["release", "hand over"]
    db = Database([True], sent)
    db.run(releasing(context, KEY, 30.0))
    assert db.steps == ["release"]


@pytest.mark.parametrize(
    ("replacing", "until_deadline", "grace"),
    [
        (False, 2.0, 10.0),  # a deadline that passed: the usual grace
        (False, None, 10.0),
        (True, 2.5, 2.5),  # replaced: the grace ends at the lease's deadline
        (True, 30.0, 10.0),
        (True, -1.0, 0.0),
    ],
)
def test_a_replaced_commands_grace_ends_by_its_lease_deadline(
    replacing: bool, until_deadline: float | None, grace: float
) -> None:
    from dislock.core.supervision import loss_grace

    assert loss_grace(replacing, until_deadline) == grace
