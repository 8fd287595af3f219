"""The lock statements as exchanges: for each, its text (``dislock.core.lock_queries``),
its parameters, and the reader of its answer (``dislock.core.answers``).

The lock code in ``dislock.aio`` and ``dislock`` asks for an exchange here, sends
it, and feeds the rows back; it never builds parameters or reads a column itself.
A new lock statement is a text in ``lock_queries``, a method here and its call site.

The hot ones (a lease's or a slot's acquisition, the renewal, the release) are sent
as calls to the functions ``dislockctl init`` installs beside the table
(``dislock.core.protocol``), each with its plain statement to fall back on.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from dislock.core import answers, lock_queries, protocol
from dislock.core import retries as retries_module
from dislock.core.answers import Acquired, SlotAnswer
from dislock.core.exchange import Answer, Exchange
from dislock.core.kinds import LEASE
from dislock.core.replace_marks import handed
from dislock.core.rows import pause_key_of
from dislock.core.unknown_outcome import Mine
from dislock.core.waiting import WAKE_CHANNEL, wake_key
from dislock.core.wrapped import CALLED

if TYPE_CHECKING:
    from dislock.core.context import LockContext
    from dislock.core.cron import SlotCandidates
    from dislock.core.renewal import Batch


class LockStatements:
    """The statements of one lock table."""

    __slots__ = ("calls", "fencing", "queries", "table_parts")

    def __init__(self, table_parts: tuple[str, ...], fencing: bool = False) -> None:
        self.table_parts = table_parts
        self.fencing = fencing
        self.queries = lock_queries.queries(table_parts, fencing)
        self.calls = {name: protocol.call(table_parts, name, a) for name, a in CALLED.items()}

    def _via(
        self, name: str, params: dict[str, Any], plain: Exchange[Answer], *, fenced: bool = False
    ) -> Exchange[Answer]:
        """``plain``, sent as a call to the function ``name`` with ``params`` (and, when
        the function is ``fenced``, whether to bump the fencing token)."""
        if fenced:
            params = {**params, "fencing": self.fencing}
        called = Exchange(self.calls[name], params, plain.read)
        return protocol.via_function(self.table_parts, called, plain)

    def acquire_until(self, key: str, owner: str, expire_at: datetime) -> Exchange[Acquired]:
        """Take the schedule row ``key`` until ``expire_at``, a slot's end, unless the key
        is paused or in a lock delay after a failover (``dislock.core.failover``)."""
        params = _claim(key, owner, expire_at=expire_at)
        plain = Exchange(self.queries.acquire_until, params, answers.read_slot_claim)
        return self._via("acquire", {**params, "ttl": None}, plain, fenced=True)

    def acquire_retrying(
        self,
        key: str,
        owner: str,
        expire_at: datetime,
        *,
        lease: str | None,
        retries: int,
        delay: float,
    ) -> Exchange[Acquired]:
        """``acquire_until`` for a job with ``retries`` (``dislock.core.retries``): its
        next attempt, ``delay`` seconds (doubling) after the last failed; ``lease``, the
        row whose expiry proves a holder vanished (None: no lease, never proven)."""
        attempt = retries_module.claim_params(lease, expire_at, retries, delay)
        params = _claim(key, owner, expire_at=expire_at, **attempt)
        plain = Exchange(self.queries.acquire_retrying, params, answers.read_retrying_claim)
        return self._via("acquire_retrying", params, plain, fenced=True)

    def reopen(
        self, key: str, value: str, slot_end: datetime, delay: float
    ) -> Exchange[datetime | None]:
        """Reopen the slot a failed attempt (its row ``value``) took, ``delay`` seconds
        from now (``dislock.core.retries.reopen``)."""
        plain = retries_module.reopen(self.queries.reopen, key, value, slot_end, delay)
        return self._via("reopen", plain.params, plain)

    def done(self, key: str, value: str, slot_end: datetime) -> Exchange[None]:
        """Mark the slot a successful attempt (its row ``value``) took done
        (``dislock.core.retries.done``)."""
        plain = retries_module.done(self.queries.done, key, value, slot_end)
        return self._via("done", plain.params, plain)

    def acquire_by_clock(
        self, key: str, owner: str, candidates: SlotCandidates
    ) -> Exchange[Acquired]:
        """Take the schedule row ``key`` until the end of the slot the database clock
        is in, among ``candidates`` (in the answer; None, and nothing taken, when the
        clock was outside them: read it, then ``acquire_until``)."""
        params = _claim(key, owner, covered_from=candidates.covered_from)
        called = {**params, "ends": candidates.ends, "latest": candidates.latest_starts}
        ends = zip(candidates.ends, candidates.latest_starts, strict=True)
        for i, (end, latest) in enumerate(ends):
            params[f"end_{i}"] = end
            params[f"latest_{i}"] = latest
        plain = Exchange(self.queries.acquire_by_clock, params, answers.read_by_clock)
        return self._via("acquire_by_clock", called, plain, fenced=True)

    def acquire_for(self, key: str, owner: str, ttl: float) -> Exchange[Acquired]:
        """Take the lease row ``key`` for ``ttl`` seconds; a TTL over the table's maximum
        takes nothing and is a ``ConfigurationError`` (``dislock.core.limits``)."""
        params = _claim(key, owner, ttl=ttl)
        plain = Exchange(self.queries.acquire_for, params, answers.lease_reader(ttl))
        called = {**params, "expire_at": None, "ttl": float(ttl)}
        return self._via("acquire", called, plain, fenced=True)

    def take_over(self, key: str, owner: str, successor: str, ttl: float) -> Exchange[Acquired]:
        """Take the live lease row ``key`` that a replaced holder handed over to
        ``successor`` (``dislock.core.replace_marks``) for ``ttl`` seconds."""
        params = _claim(key, owner, successor=handed(successor), ttl=ttl)
        plain = Exchange(self.queries.take_over, params, answers.lease_reader(ttl))
        return self._via("take_over", params, plain, fenced=True)

    def acquire_slot(self, keys: list[str], owner: str, ttl: float) -> Exchange[SlotAnswer]:
        """Take the first free row among the slot rows ``keys`` (``keys[0]`` is the
        plain lease row) for ``ttl`` seconds."""
        params = {"keys": keys, "pause": pause_key_of(keys[0]), "owner": owner, "ttl": ttl}
        plain = Exchange(self.queries.acquire_slot, params, answers.slot_reader(ttl))
        return self._via("acquire_slot", params, plain, fenced=True)

    def look(
        self,
        key: str,
        *,
        ttl: float | None = None,
        pick: Callable[[datetime], datetime | None] | None = None,
    ) -> Exchange[Acquired | None]:
        """The refusal by a live row of ``acquire_until`` (with ``ttl``, of
        ``acquire_for``; with a candidates' ``pick``, of ``acquire_by_clock``), read
        without the upsert by primary key, before it on a new connection (docs/design.md
        says why)."""
        pause = pause_key_of(key)
        reader = answers.look_reader(key, pause, ttl=ttl, pick=pick)
        return Exchange(self.queries.look, {"key": key, "pause": pause}, reader)

    def renew(self, batch: Batch) -> Exchange[list[answers.Renewed]]:
        """Renew the leases of ``batch`` that are still ours, each by its own TTL: a lease
        missing from the answer is lost."""
        params = batch.params()
        plain = Exchange(self.queries.renew_batch, params, answers.read_renewed)
        # (A TTL given as an int would make an int8[] the function does not take.)
        return self._via("renew", {**params, "ttls": list(map(float, params["ttls"]))}, plain)

    def release(self, key: str, owner: str, lock_key: str, mode: str = LEASE) -> Exchange[bool]:
        """End our row ``key`` of the lock ``lock_key`` now, marked released
        (``dislock.core.rows.RELEASED_MARK``), waking the lease's waiters at commit
        (``mode``: of a lease, or a group's); False if another owner had taken it."""
        params = {"key": key, **_waking(owner, lock_key, mode)}
        plain = Exchange(self.queries.release, params, answers.read_released)
        return self._via("release", params, plain)

    def hand_back(
        self, keys: list[str], owner: str, lock_key: str, mode: str = LEASE
    ) -> Exchange[bool]:
        """``release`` for each of our rows among ``keys``, of the lock ``lock_key``:
        whichever slot of an N-holder lease an interrupted or unconfirmed acquisition
        may have taken.  (Not the holder's release too: matching an array costs that
        hot path about 0.05 ms.)"""
        params = {"keys": keys, **_waking(owner, lock_key, mode)}
        plain = Exchange(self.queries.hand_back, params, answers.read_released)
        return self._via("hand_back", params, plain)

    def mine(self, keys: list[str], owner: str) -> Exchange[list[Mine]]:
        """The live rows of ``owner`` among ``keys``, for an acquisition whose answer was
        lost."""
        return Exchange(self.queries.mine, {"keys": keys, "owner": owner}, answers.read_mine)

    def now(self) -> Exchange[datetime]:
        """The database clock."""
        return Exchange(self.queries.now, {}, answers.read_clock)


def _claim(key: str, owner: str, **more: Any) -> dict[str, Any]:
    """The parameters of an acquisition of the row ``key`` by ``owner``, and ``more``."""
    return {"key": key, "pause": pause_key_of(key), "owner": owner, **more}


def _waking(owner: str, lock_key: str, mode: str) -> dict[str, Any]:
    """The parameters of a release by ``owner`` that wakes the waiters of ``lock_key``."""
    return {"owner": owner, "channel": WAKE_CHANNEL, "wake_key": wake_key(lock_key, mode)}


@lru_cache(maxsize=64)
def statements(table_parts: tuple[str, ...], fencing: bool = False) -> LockStatements:
    """The statements of the table ``table_parts`` (``lock_queries.queries``), kept."""
    return LockStatements(table_parts, fencing)


def statements_for(context: LockContext) -> LockStatements:
    return statements(tuple(context.table_parts), context.fencing)
