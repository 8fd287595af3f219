"""The batched renewer's decisions, on made-up monotonic times (no database, no clock)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dislock.core.context import LeaseLossPolicy
from dislock.core.lease_clock import LeaseClock, LeaseSettings
from dislock.core.renewal import Renewal, RenewalPlan, renewal_listeners, report_renewal

TABLE = ("key_value",)


def lease(
    key: str,
    *,
    at: float,
    ttl: float = 10.0,
    interval: float = 2.0,
    table: tuple[str, ...] = TABLE,
) -> Renewal:
    settings = LeaseSettings(ttl=ttl, interval=interval, policy=LeaseLossPolicy.TERMINATE)
    return Renewal(
        key=key, owner=f"owner-{key}", table_parts=table, clock=LeaseClock(settings, acquired_at=at)
    )


def test_nothing_is_sent_until_a_lease_is_due() -> None:
    plan = RenewalPlan()
    plan.add(lease("a", at=100.0))
    assert plan.due(101.0) == []
    assert plan.until_next(101.0) == 1.0


def test_leases_nearly_due_join_the_batch_and_line_up() -> None:
    plan = RenewalPlan()
    a, b, c = lease("a", at=100.0), lease("b", at=100.6), lease("c", at=101.5)
    for r in (a, b, c):
        plan.add(r)
    (batch,) = plan.due(102.0)  # a is due; b within half a heartbeat; c is not
    assert batch.renewals == [a, b]
    assert batch.params() == {
        "keys": ["a", "b"],
        "owners": ["owner-a", "owner-b"],
        "ttls": [10.0, 10.0],
    }
    plan.settle(batch, sent_at=102.0, now=102.01, renewed=[("a", "owner-a"), ("b", "owner-b")])
    assert a.clock.next_renewal == b.clock.next_renewal == 104.0
    (batch,) = plan.due(103.5)  # c is due now, and a and b are close enough to come along
    assert batch.renewals == [a, b, c]


def test_one_batch_per_table() -> None:
    plan = RenewalPlan()
    plan.add(lease("a", at=100.0))
    plan.add(lease("b", at=100.0, table=("ops", "locks")))
    batches = plan.due(102.0)
    assert sorted(batch.table_parts for batch in batches) == [("key_value",), ("ops", "locks")]


def test_a_lease_missing_from_the_answer_is_lost_alone() -> None:
    plan = RenewalPlan()
    a, b = lease("a", at=100.0), lease("b", at=100.0)
    plan.add(a)
    plan.add(b)
    (batch,) = plan.due(102.0)
    lost = plan.settle(batch, sent_at=102.0, now=102.01, renewed=[("a", "owner-a")])
    assert lost == [b]
    assert not a.clock.lost and a.clock.deadline == 102.0 + 10.0 - 1.0
    assert b.clock.lost_reason is not None and "no longer ours" in b.clock.lost_reason
    # Lost leases are neither renewed again nor reported twice.
    assert [r for batch in plan.due(104.5) for r in batch.renewals] == [a]
    assert plan.check_deadlines(200.0) == [a]


def test_another_owner_of_the_same_key_does_not_count() -> None:
    plan = RenewalPlan()
    a = lease("a", at=100.0)
    plan.add(a)
    (batch,) = plan.due(102.0)
    assert plan.settle(batch, sent_at=102.0, now=102.01, renewed=[("a", "someone-else")]) == [a]


def test_a_failed_batch_is_retried_for_each_lease_until_its_own_deadline() -> None:
    plan = RenewalPlan()
    short = lease("short", at=100.0, ttl=4.0, interval=1.0)
    long = lease("long", at=100.0, ttl=20.0, interval=5.0)
    plan.add(short)
    plan.add(long)
    batches = plan.due(101.0)
    assert [r.key for r in batches[0].renewals] == ["short"]  # long is not due yet
    assert plan.failed(batches[0], OSError("connection reset"), now=101.0) == []
    retry_in = plan.until_next(101.0)
    assert retry_in is not None and 0 < retry_in <= 1.0
    assert plan.check_deadlines(103.6) == [short]  # 100 + 4 - 0.4
    assert plan.until_deadline(103.6) == 100.0 + 20.0 - 1.0 - 103.6


def test_the_batch_timeout_is_the_most_any_lease_in_it_allows() -> None:
    plan = RenewalPlan()
    plan.add(lease("a", at=100.0, ttl=4.0, interval=1.0))
    plan.add(lease("b", at=100.0, ttl=60.0, interval=3.0))
    (batch,) = plan.due(103.0)
    assert batch.timeout(103.0) == 3.0


def test_removed_leases_are_forgotten() -> None:
    plan = RenewalPlan()
    a = lease("a", at=100.0)
    plan.add(a)
    (batch,) = plan.due(102.0)
    plan.remove(a)
    assert plan.settle(batch, sent_at=102.0, now=102.01, renewed=[]) == []
    assert len(plan) == 0 and plan.until_next(102.0) is None and plan.until_deadline(102.0) is None


def test_renewal_listeners_hear_the_leases_still_held_and_a_raising_one_is_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plan = RenewalPlan()
    a, b = lease("a", at=100.0), lease("b", at=100.0)
    plan.add(a)
    plan.add(b)
    (batch,) = plan.due(102.0)
    plan.settle(batch, sent_at=102.0, now=102.01, renewed=[("a", "owner-a")])  # b lost its row
    heard: list[tuple[list[str], float]] = []

    def broken(keys: Sequence[str], seconds: float) -> None:
        raise RuntimeError("listener bug")

    def listener(keys: Sequence[str], seconds: float) -> None:
        heard.append((list(keys), seconds))

    renewal_listeners.extend([broken, listener])
    try:
        report_renewal(batch, 0.01)
    finally:
        renewal_listeners.remove(broken)
        renewal_listeners.remove(listener)
    assert heard == [(["a"], 0.01)]
    assert "a renewal listener raised" in caplog.text


def test_a_renewal_that_succeeded_tells_each_followed_lease_its_new_deadline() -> None:
    """What the supervisor passes on to the command's guard: the new deadline of each
    lease that has a follower and is still held, none for a lease the batch lost."""
    plan = RenewalPlan()
    kept, lost, unfollowed = lease("a", at=100.0), lease("b", at=100.0), lease("c", at=100.0)
    told: list[tuple[str, float]] = []
    kept.on_renewed = lambda deadline: told.append(("a", deadline))
    lost.on_renewed = lambda deadline: told.append(("b", deadline))
    for r in (kept, lost, unfollowed):
        plan.add(r)
    (batch,) = plan.due(102.0)
    plan.settle(batch, sent_at=102.0, now=102.01, renewed=[("a", "owner-a"), ("c", "owner-c")])
    from dislock.core.renewal import new_deadlines

    for follow, deadline in new_deadlines(batch):
        follow(deadline)
    assert told == [("a", kept.clock.deadline)]
    assert kept.clock.deadline == 102.0 + 10.0 - 1.0  # sent at, plus the TTL, less the margin
