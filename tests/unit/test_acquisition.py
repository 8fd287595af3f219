"""Every path of an acquisition (``dislock.core.acquisition``), followed without a
database: each case lists the steps the sequence takes, the replies it is fed (an
answer, or the error the driver would throw in), and what it decides.

The same paths run against a real PostgreSQL in the contract suite
(``contract/test_locks.py``, ``contract/test_lost_answers.py``,
``contract/one_implementation/test_lost_answers_in_process.py``,
``contract/one_implementation/test_lock_delay.py``, ``contract/test_connection_limits.py``);
here each is one row of a table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import psycopg.errors
import pytest

from dislock.core import replace_marks
from dislock.core.acquisition import (
    Ask,
    Connect,
    Crowded,
    Given,
    Noted,
    Pause,
    Steps,
    claiming,
    claiming_slot,
)
from dislock.core.answers import Acquired, SlotAnswer
from dislock.core.context import LockContext, default_owner
from dislock.core.cron import SlotCandidates
from dislock.core.errors import (
    DatabaseUnreachableError,
    KeyNotGrantedError,
    LockDelayedError,
    LockNotAcquiredError,
    LockPausedError,
    NotReplicatedError,
    SlotLateError,
    StatementTimeout,
)
from dislock.core.lease_acquisition import LeaseTry, releasing, trying_lease
from dislock.core.lease_clock import LeaseSettings
from dislock.core.lock_statements import LockStatements, statements, statements_for
from dislock.core.patience import ConnectPatience
from dislock.core.retries import LATE_MARK
from dislock.core.schedule_state import claiming_schedule_slot, schedule_refusal
from dislock.core.unknown_outcome import HeldRows, Mine

URL = "postgresql://jobs:hunter2@db.internal/app"
NOW = datetime(2026, 12, 3, 12, 0, 30, tzinfo=timezone.utc)
SLOT_END = datetime(2026, 12, 3, 12, 1, tzinfo=timezone.utc)
LOST = psycopg.OperationalError("server closed the connection unexpectedly")
TAKEN = Acquired(True, 7, None, None, timeline=3)
HELD_ELSEWHERE = Acquired(False, None, None, None)


SCHEDULE_KEY = "cronjob-lock:schedule:nightly"
LEASE_KEY = "cronjob-lock:lease:nightly"

_RENAMED = {"acquire_for": "acquire", "acquire_until": "acquire", "renew_batch": "renew"}
"""Plain statements named as the function call that stands for them."""


def _named(table: LockStatements) -> list[tuple[object, str]]:
    """Each statement of ``table`` (and each function's call) by its query, named."""
    queries, parts = table.queries, table.table_parts
    named = [(getattr(queries, f), _RENAMED.get(f, f)) for f in queries._fields]
    named += list(zip(table.calls.values(), table.calls, strict=True))
    named += [
        (replace_marks.mark_query(parts), "mark"),
        (replace_marks.hand_over_query(parts), "hand over"),
    ]
    named += [(replace_marks.withdraw_query(parts), "withdraw")]
    return [(query, name.replace("_", " ")) for query, name in named]


STATEMENTS = _named(statements(("locks",))) + _named(statements(("locks",), True))


def statement_name(ask: Ask[Any]) -> str:
    """Which statement an ``Ask`` sends, by its query."""
    return next(name for query, name in STATEMENTS if query == ask.exchange.query)


@dataclass(frozen=True)
class Late:
    """An answer that comes ``seconds`` after its statement was sent."""

    seconds: float
    answer: Any


@dataclass
class Database:
    """The replies of one case, in order: an answer, or an error to throw in."""

    replies: list[Any]
    expect: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The parameters each statement must be sent with (by name; a statement not
    named here must not be sent at all)."""
    crowded: bool = False
    now: list[float] = field(default_factory=lambda: [0.0])
    steps: list[str] = field(default_factory=list)

    held: HeldRows = field(default_factory=HeldRows)

    def clock(self) -> float:
        return self.now[0]

    @property
    def given(self) -> Given:
        """Its clock, the local wall clock at ``NOW``, and rows held by nobody else."""
        return Given(self.clock, lambda: NOW, self.held)

    def run(self, sequence: Steps[Any]) -> Any:
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = sequence.throw(error) if error is not None else sequence.send(reply)
            except StopIteration as done:
                return done.value
            reply, error = None, None
            if isinstance(step, Crowded):
                self.steps.append("crowded?")
                reply = self.crowded
            elif isinstance(step, Pause):
                self.steps.append("pause")
                self.now[0] += step.seconds
            elif isinstance(step, Noted):
                self.steps.append(f"noted {step.timeline}")
            elif isinstance(step, Connect):
                self.steps.append("connect")
            else:
                assert isinstance(step, Ask)
                self.steps.append(self.checked(step))
                found = self.replies.pop(0)
                if isinstance(found, Late):
                    self.now[0] += found.seconds
                    found = found.answer
                if isinstance(found, BaseException):
                    error = found
                else:
                    reply = found

    def checked(self, ask: Ask[Any]) -> str:
        """The name of the statement ``ask`` sends, once its parameters are checked."""
        name = statement_name(ask)
        assert name in self.expect, f"{name!r} sent, not expected: {ask.exchange.params}"
        sent = {key: ask.exchange.params.get(key, "(none)") for key in self.expect[name]}
        assert sent == self.expect[name], f"{name!r} sent with {sent}"
        return name


def lease_context(**fields: Any) -> LockContext:
    fields.setdefault("owner", default_owner())
    fields.setdefault("run_ttl_seconds", 30.0)
    fields.setdefault("lease_interval_seconds", 10.0)
    return LockContext(url=URL, table_parts=["locks"], lock_key="nightly", **fields)


def lease_claim(db: Database, context: LockContext, *, patience: bool = True) -> Steps[Acquired]:
    statements = statements_for(context)
    key = "cronjob-lock:lease:nightly"
    return claiming(
        statements.acquire_for(key, context.owner, 30.0),
        10.0,
        context=context,
        key=key,
        what=f"lease {key!r}",
        patience=ConnectPatience(5.0, db.clock()) if patience else None,
        look=statements.look(key, ttl=30.0),
        given=db.given,
    )


def lease_sent(
    context: LockContext, keys: list[str] | None = None, ttl: float = 30.0
) -> dict[str, dict[str, Any]]:
    """What a lease's statements are sent with: its row (or its slots' rows, the
    first being the lease's own), its owner, its TTL."""
    keys, owner = keys or [LEASE_KEY], context.owner
    return {
        "acquire": {"key": keys[0], "owner": owner, "ttl": ttl, "expire_at": None},
        "acquire slot": {"keys": keys, "owner": owner, "ttl": ttl},
        "look": {"key": keys[0], "pause": "cronjob-lock:pause:nightly"},
        "mine": {"keys": keys, "owner": owner},
        "release": {"key": keys[0], "owner": owner},
        "hand back": {"keys": keys, "owner": owner},
    }


def schedule_sent(
    context: LockContext, owner: str | None = None, expire_at: datetime = SLOT_END
) -> dict[str, dict[str, Any]]:
    """What a schedule slot's statements are sent with: its row, the owner it is
    claimed as (``owner``: a late mark), the slot's end, the candidates around the
    local clock given (``NOW``)."""
    claimed_as = {"key": SCHEDULE_KEY, "owner": owner or context.owner}
    sent: dict[str, dict[str, Any]] = {
        "acquire": {**claimed_as, "expire_at": expire_at, "ttl": None},
        "acquire retrying": {**claimed_as, "expire_at": expire_at, "attempts": 3},
        "look": {"key": SCHEDULE_KEY},
        "mine": {"keys": [SCHEDULE_KEY], "owner": context.owner},
        "now": {},
    }
    if context.schedule is not None and context.cron_zone is not None:
        around = SlotCandidates.around(context.schedule, NOW, context.cron_zone.tz)
        sent["acquire by clock"] = {**claimed_as, "covered_from": around.covered_from}
    return sent


@dataclass(frozen=True)
class Case:
    name: str
    replies: list[Any]
    steps: list[str]
    expect: Callable[[Any], bool] | type[BaseException]
    crowded: bool = False


def mine(key: str = "cronjob-lock:lease:nightly", expire_at: datetime = SLOT_END) -> Mine:
    return Mine(key, 9, expire_at, 4)


LEASE_CASES = [
    Case(
        "a connection opened at the first try sends the acquiring statement alone (one round trip)",
        [TAKEN],
        ["crowded?", "acquire", "noted 3"],
        lambda answer: answer == TAKEN,
    ),
    Case(
        "through a crowded door (a herd) a live row is refused by the look, for a read's cost",
        [HELD_ELSEWHERE],
        ["crowded?", "look"],
        lambda answer: answer == HELD_ELSEWHERE,
        crowded=True,
    ),
    Case(
        "a look that finds the row free leaves the decision to the acquiring statement",
        [None, TAKEN],
        ["crowded?", "look", "acquire", "noted 3"],
        lambda answer: answer == TAKEN,
        crowded=True,
    ),
    Case(
        "a look that fails is no answer: the acquiring statement is sent",
        [psycopg.errors.UndefinedColumn("column fence does not exist"), TAKEN],
        ["crowded?", "look", "acquire", "noted 3"],
        lambda answer: answer == TAKEN,
        crowded=True,
    ),
    Case(
        "a lost answer is read back: the row was taken",
        [LOST, [mine()]],
        ["crowded?", "acquire", "mine", "noted 4"],
        lambda answer: answer.acquired and answer.token == 9 and answer.timeline == 4,
    ),
    Case(
        "a lost answer that took nothing is sent again",
        [LOST, [], TAKEN],
        ["crowded?", "acquire", "mine", "acquire", "noted 3"],
        lambda answer: answer == TAKEN,
    ),
    Case(
        "the read back loses its answer too: it is read again",
        [LOST, LOST, [mine()]],
        ["crowded?", "acquire", "mine", "pause", "mine", "noted 4"],
        lambda answer: answer.acquired,
    ),
    Case(
        "an answer synchronous replication did not confirm is handed back",
        [NotReplicatedError("not confirmed by a standby"), True],
        ["crowded?", "acquire", "hand back"],
        NotReplicatedError,
    ),
    Case(
        "a hand back that fails still raises the replication error",
        [NotReplicatedError("not confirmed by a standby"), LOST],
        ["crowded?", "acquire", "hand back"],
        NotReplicatedError,
    ),
    Case(
        "row-level security refusing the key is the grant's error",
        [psycopg.errors.InsufficientPrivilege("new row violates row-level security policy")],
        ["crowded?", "acquire"],
        KeyNotGrantedError,
    ),
    Case(
        "a missing privilege is the server's error, not an unknown outcome",
        [psycopg.errors.InsufficientPrivilege("permission denied for table locks")],
        ["crowded?", "acquire"],
        psycopg.errors.InsufficientPrivilege,
    ),
    Case(
        "an error the server answered with did nothing: raised as it is",
        [psycopg.errors.QueryCanceled("canceling statement due to statement timeout")],
        ["crowded?", "acquire"],
        psycopg.errors.QueryCanceled,
    ),
]


@pytest.mark.parametrize("case", LEASE_CASES, ids=[case.name for case in LEASE_CASES])
def test_a_lease_claim(case: Case) -> None:
    context = lease_context()
    db = Database(list(case.replies), lease_sent(context), crowded=case.crowded)
    if isinstance(case.expect, type):
        with pytest.raises(case.expect):
            db.run(lease_claim(db, context))
    else:
        assert case.expect(db.run(lease_claim(db, context)))
    assert db.steps == case.steps
    assert db.replies == []


def test_a_lost_answer_without_patience_is_not_read_back() -> None:
    context = lease_context()
    db = Database([LOST], lease_sent(context))
    with pytest.raises(psycopg.OperationalError):
        db.run(lease_claim(db, context, patience=False))
    assert db.steps == ["crowded?", "acquire"]


def test_a_lost_answer_is_read_back_only_within_the_patience() -> None:
    context = lease_context()
    db = Database([LOST] + [LOST] * 50, lease_sent(context))
    with pytest.raises(DatabaseUnreachableError, match="lost"):
        db.run(lease_claim(db, context))
    assert db.steps[:3] == ["crowded?", "acquire", "mine"]
    assert set(db.steps[3:]) == {"pause", "mine"}
    assert db.clock() <= 5.0 + 2.0  # the patience, and at most one last pause


def test_an_owner_chosen_by_the_user_is_not_trusted_after_a_lost_answer() -> None:
    """Another machine may share it: its row is not proof of this acquisition."""
    context = lease_context(owner="nightly-job")
    db = Database([LOST, [mine()]], lease_sent(context))
    answer = db.run(lease_claim(db, context))
    assert answer == Acquired.nothing()


def test_a_slot_of_an_n_holder_lease() -> None:
    context = lease_context(slots=3)
    keys = [f"cronjob-lock:lease#{n}:nightly" for n in (1, 2, 3)]
    db = Database([LOST, [mine(keys[1])]], lease_sent(context, keys))
    answer = db.run(
        claiming_slot(
            statements_for(context).acquire_slot(keys, context.owner, 30.0),
            10.0,
            context=context,
            keys=keys,
            what="a slot of lease 'nightly'",
            patience=ConnectPatience(5.0, db.clock()),
            given=db.given,
        )
    )
    assert answer == SlotAnswer(keys[1], 9, 1, None, None, None)
    assert db.steps == ["acquire slot", "mine", "noted 4"]


def schedule_claim(db: Database, context: LockContext) -> Steps[tuple[Acquired, datetime]]:
    return claiming_schedule_slot(
        context,
        "cronjob-lock:schedule:nightly",
        ConnectPatience(5.0, db.clock()),
        given=db.given,
    )


def test_a_slot_is_claimed_by_the_database_clock_in_one_statement() -> None:
    context = lease_context(schedule="* * * * *")
    db = Database([TAKEN._replace(slot_end=SLOT_END)], schedule_sent(context))
    answer, ends = db.run(schedule_claim(db, context))
    assert (answer.acquired, ends) == (True, SLOT_END)
    assert db.steps == ["crowded?", "acquire by clock", "noted 3"]


def test_a_database_clock_far_from_ours_is_read_before_the_slot_is_claimed() -> None:
    far = NOW + timedelta(hours=2)
    context = lease_context(schedule="* * * * *")
    ends_far = datetime(2026, 12, 3, 14, 1, tzinfo=timezone.utc)
    db = Database([Acquired.nothing(), far, TAKEN], schedule_sent(context, expire_at=ends_far))
    answer, ends = db.run(schedule_claim(db, context))
    assert answer == TAKEN
    assert ends == ends_far
    assert db.steps == [
        "crowded?",
        "acquire by clock",
        "noted None",
        "now",
        "crowded?",
        "acquire",
        "noted 3",
    ]


def test_a_slot_given_by_next_run_time_is_claimed_until_it() -> None:
    context = lease_context(next_run_time=SLOT_END)
    db = Database([HELD_ELSEWHERE], schedule_sent(context), crowded=True)
    answer, ends = db.run(schedule_claim(db, context))
    assert (answer, ends) == (HELD_ELSEWHERE, SLOT_END)
    assert db.steps == ["crowded?", "look"]


def test_a_slot_lost_answer_trusts_only_a_row_ending_where_this_slot_ends() -> None:
    """A live row of an earlier slot, which a database clock behind ours still shows,
    is not the new slot's."""
    earlier = SLOT_END - timedelta(minutes=1)
    context = lease_context(next_run_time=SLOT_END)
    db = Database([LOST, [mine(SCHEDULE_KEY, earlier)], TAKEN], schedule_sent(context))
    answer, _ = db.run(schedule_claim(db, context))
    assert answer == TAKEN
    assert db.steps == ["crowded?", "acquire", "mine", "acquire", "noted 3"]


def test_a_slot_with_retries_reads_the_clock_then_claims_its_next_attempt() -> None:
    """The slot's end names it in the row's mark, so it is known before the claim;
    no look goes first (a vanished holder's row is live, yet takeable)."""
    context = lease_context(schedule="* * * * *", retries=2)
    db = Database([NOW, TAKEN._replace(attempt=2)], schedule_sent(context), crowded=True)
    answer, ends = db.run(schedule_claim(db, context))
    assert (answer.attempt, ends) == (2, SLOT_END)
    assert db.steps == ["now", "acquire retrying", "noted 3"]


@pytest.mark.parametrize(
    ("now", "late"),
    [(NOW, False), (NOW + timedelta(seconds=20), True)],
    ids=["within", "past"],
)
def test_past_its_start_deadline_a_slot_is_claimed_as_its_late_mark(
    now: datetime, late: bool
) -> None:
    """The slot of ``* * * * *`` that ends at 12:01 began at 12:00; the deadline is 40 s."""
    context = lease_context(schedule="* * * * *", start_deadline_seconds=40)
    marked = context.owner + LATE_MARK if late else None
    db = Database([now, TAKEN], schedule_sent(context, owner=marked))
    answer, ends = db.run(schedule_claim(db, context))
    assert ends == SLOT_END
    assert db.steps == ["now", "acquire", "noted 3"]
    assert answer.began_at == (SLOT_END - timedelta(minutes=1) if late else None)
    refusal = schedule_refusal(context, answer, ends)
    if late:
        assert isinstance(refusal, SlotLateError)
        assert "began at 2026-12-03T12:00:00+00:00, more than 40 s ago" in str(refusal)
    else:
        assert refusal is None


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (
            HELD_ELSEWHERE._replace(retry_at=NOW + timedelta(minutes=5)),
            "an attempt failed; the next may start at 2026-12-03T12:05:30+00:00",
        ),
        (HELD_ELSEWHERE._replace(attempt=4), "has used its 3 attempts"),
        (HELD_ELSEWHERE, "was already started by another owner"),
    ],
    ids=["reopened for later", "attempts used", "taken"],
)
def test_what_a_retried_slots_refusal_says(answer: Acquired, said: str) -> None:
    refusal = schedule_refusal(lease_context(schedule="* * * * *", retries=2), answer, SLOT_END)
    assert isinstance(refusal, LockNotAcquiredError)
    assert said in str(refusal)


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (TAKEN, None),
        (Acquired(False, None, "db migration", NOW + timedelta(hours=1)), LockPausedError),
        (HELD_ELSEWHERE._replace(delayed_until=NOW + timedelta(seconds=40)), LockDelayedError),
        (HELD_ELSEWHERE, LockNotAcquiredError),
    ],
    ids=["taken", "paused", "delayed", "started elsewhere"],
)
def test_what_a_slots_answer_means(answer: Acquired, error: type[Exception] | None) -> None:
    refusal = schedule_refusal(lease_context(schedule="* * * * *"), answer, SLOT_END)
    if error is None:
        assert refusal is None
    else:
        assert isinstance(refusal, error), refusal
        assert "nightly" in str(refusal)


def lease_try(db: Database, context: LockContext) -> Steps[LeaseTry]:
    settings = LeaseSettings.from_context(context)
    return trying_lease(context, settings, ConnectPatience(5.0, db.clock()), given=db.given)


def test_a_lease_is_taken_with_its_clock_started_as_the_statement_was_sent() -> None:
    context = lease_context()
    db = Database([Late(0.5, TAKEN)], lease_sent(context))
    tried = db.run(lease_try(db, context))
    assert (tried.key, tried.fence) == ("cronjob-lock:lease:nightly", 7)
    assert tried.clock is not None and tried.clock.deadline == 30.0 - tried.clock.margin
    assert db.steps == ["connect", "crowded?", "acquire", "noted 3"]


def test_a_lease_held_elsewhere_is_not_taken_and_says_why() -> None:
    delay = NOW + timedelta(seconds=40)
    context = lease_context()
    db = Database([HELD_ELSEWHERE._replace(delayed_until=delay)], lease_sent(context))
    tried = db.run(lease_try(db, context))
    assert (tried.clock, tried.delayed_until) == (None, delay)


def test_a_paused_lease_raises_at_once() -> None:
    context = lease_context()
    db = Database(
        [Acquired(False, None, "db migration", NOW + timedelta(hours=1))], lease_sent(context)
    )
    with pytest.raises(LockPausedError, match="db migration"):
        db.run(lease_try(db, context))


def test_an_answer_after_the_lease_deadline_is_released_not_worked_on() -> None:
    context = lease_context(run_ttl_seconds=10.0, lease_interval_seconds=2.0)
    db = Database([Late(9.5, TAKEN), True], lease_sent(context, ttl=10.0))
    tried = db.run(lease_try(db, context))
    assert tried.clock is None
    assert db.steps == ["connect", "crowded?", "acquire", "noted 3", "release"]


def test_a_slot_lost_in_a_race_is_tried_again_while_others_looked_free() -> None:
    context = lease_context(slots=3)
    slot_2 = "cronjob-lock:lease#2:nightly"
    lost_race = SlotAnswer(None, None, 2, None, None, None)
    keys = [LEASE_KEY, slot_2, "cronjob-lock:lease#3:nightly"]
    db = Database(
        [lost_race, SlotAnswer(slot_2, 5, 1, None, None, None)], lease_sent(context, keys)
    )
    tried = db.run(lease_try(db, context))
    assert (tried.key, tried.fence) == (slot_2, 5)
    assert db.steps == ["connect", "acquire slot", "connect", "acquire slot"]


def test_a_full_lease_of_slots_is_not_tried_again() -> None:
    context = lease_context(slots=3)
    keys = [LEASE_KEY, "cronjob-lock:lease#2:nightly", "cronjob-lock:lease#3:nightly"]
    db = Database([SlotAnswer(None, None, 0, None, None, None)], lease_sent(context, keys))
    tried = db.run(lease_try(db, context))
    assert (tried.key, tried.clock) == (LEASE_KEY, None)
    assert db.steps == ["connect", "acquire slot"]


READ_ONLY = psycopg.errors.ReadOnlySqlTransaction(
    "cannot execute INSERT in a read-only transaction"
)


def test_a_read_only_answer_is_ridden_out_from_a_fresh_connection_on() -> None:
    """A demoting primary a proxy still routes to: the whole try again, after a pause
    (the hub retired the connection that answered), its lease clock started anew."""
    context = lease_context()
    db = Database([READ_ONLY, Late(0.5, TAKEN)], lease_sent(context))
    tried = db.run(lease_try(db, context))
    assert tried.fence == 7 and tried.clock is not None
    # The clock started as the second try was sent, after the pause, not at the first.
    assert tried.clock.deadline > 30.0 - tried.clock.margin
    again = ["connect", "crowded?", "acquire"]
    assert db.steps == [*again, "pause", *again, "noted 3"]


def test_an_unconfirmed_acquisition_is_handed_back_then_ridden_out() -> None:
    context = lease_context()
    db = Database(
        [NotReplicatedError("not confirmed by a standby"), True, TAKEN], lease_sent(context)
    )
    tried = db.run(lease_try(db, context))
    assert tried.fence == 7
    assert db.steps == [
        *["connect", "crowded?", "acquire", "hand back", "pause"],
        *["connect", "crowded?", "acquire", "noted 3"],
    ]


def test_a_timed_out_acquisition_is_handed_back_then_ridden_out() -> None:
    """Queued behind a row a commit waiting for its synchronous standby still locks
    (or a fenced writer's commit): cancelled, handed back in case the cancel crossed
    its commit, and tried again."""
    context = lease_context()
    db = Database(
        [StatementTimeout("no answer within 1.00 s; cancelled"), True, TAKEN], lease_sent(context)
    )
    tried = db.run(lease_try(db, context))
    assert tried.fence == 7
    assert db.steps == [
        *["connect", "crowded?", "acquire", "hand back", "pause"],
        *["connect", "crowded?", "acquire", "noted 3"],
    ]


def test_a_passing_answer_past_the_patience_is_raised_saying_how_long() -> None:
    context = lease_context()
    db = Database([READ_ONLY, Late(6.0, READ_ONLY)], lease_sent(context))  # the patience is 5 s
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction, match=r"answered so for 6\.\d s"):
        db.run(lease_try(db, context))
    assert db.steps.count("acquire") == 2


def test_a_schedule_slot_rides_out_a_read_only_answer() -> None:
    context = lease_context(schedule="* * * * *")
    db = Database([READ_ONLY, TAKEN._replace(slot_end=SLOT_END)], schedule_sent(context))
    answer, ends = db.run(schedule_claim(db, context))
    assert (answer.acquired, ends) == (True, SLOT_END)
    clock = ["crowded?", "acquire by clock"]
    assert db.steps == [*clock, "pause", *clock, "noted 3"]


def test_other_errors_are_not_ridden_out() -> None:
    denied = psycopg.errors.InsufficientPrivilege("permission denied for table locks")
    context = lease_context()
    db = Database([denied], lease_sent(context))
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        db.run(lease_try(db, context))
    assert db.steps == ["connect", "crowded?", "acquire"]


def test_a_lease_of_slots_stops_trying_after_as_many_lost_races_as_it_has_slots() -> None:
    """Each race lost follows someone else's success: at most ``slots`` tries."""
    context = lease_context(slots=3)
    keys = [LEASE_KEY, "cronjob-lock:lease#2:nightly", "cronjob-lock:lease#3:nightly"]
    lost_race = SlotAnswer(None, None, 2, None, None, None)
    db = Database([lost_race] * 3, lease_sent(context, keys))
    tried = db.run(lease_try(db, context))
    assert (tried.key, tried.clock) == (LEASE_KEY, None)
    assert db.steps == ["connect", "acquire slot"] * 3


def test_the_last_attempt_of_a_slot_is_refused_as_started_not_as_used_up() -> None:
    context = lease_context(schedule="* * * * *", retries=2)
    refusal = schedule_refusal(context, HELD_ELSEWHERE._replace(attempt=3), SLOT_END)
    assert "was already started by another owner" in str(refusal)


def test_a_release_that_fails_is_not_confirmed_and_the_row_is_left_to_expire(
    caplog: pytest.LogCaptureFixture,
) -> None:
    context = lease_context()
    db = Database([LOST], lease_sent(context))
    with caplog.at_level(logging.WARNING, logger="dislock"):
        assert db.run(releasing(context, LEASE_KEY, 30.0)) is False
    assert "expires by itself within 30 s" in caplog.text and "hunter2" not in caplog.text


def test_an_untrusted_row_after_a_lost_answer_is_said_to_be_not_this_acquisitions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    context = lease_context(owner="nightly-job")
    db = Database([LOST, [mine()]], lease_sent(context))
    with caplog.at_level(logging.INFO, logger="dislock"):
        db.run(lease_claim(db, context))
    assert "was not this acquisition's to claim" in caplog.text
    assert "had taken nothing" not in caplog.text


def test_a_lost_answer_that_took_a_row_claims_it_in_the_rows_given() -> None:
    """So that another lock of this process does not take it for its own."""
    context = lease_context()
    db = Database([LOST, [mine()]], lease_sent(context))
    db.run(lease_claim(db, context))
    row = (("locks",), LEASE_KEY, context.owner)
    assert not db.held.claim(*row, read_sent_at=db.clock())
