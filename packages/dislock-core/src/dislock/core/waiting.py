"""Waiting for a lease held elsewhere, and N-holder leases: the decisions, without I/O.

A waiter is woken by the holder's release (``LISTEN``/``NOTIFY``), else by jittered
polling, which also runs, more slowly, beside ``LISTEN`` for a holder that died
(docs/design.md, "Lock kinds, waiting and slots").  Any role may ``NOTIFY``, so a
wake-up is a hint: the waiter reads the lease's rows (``held_query``), wake-ups
close together read once (``WakeReads``), and tries the lease only when one is free.
The start-up jitter (``jitter_delay``) is decided here too.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from psycopg import sql

from dislock.core import kinds
from dislock.core.errors import ConfigurationError
from dislock.core.exchange import Exchange, Rows, select_list
from dislock.core.variables import WAIT_POLL

WAKE_CHANNEL = "dislock_release"
"""The ``NOTIFY`` channel of every release; the payload says which lease."""

DEFAULT_POLL_SECONDS: float = WAIT_POLL.value
"""Cadence of the tries when nothing can wake the waiter (``wait_poll_seconds``)."""

SAFETY_POLL_SECONDS = 2.0
"""Cadence of the tries while ``LISTEN`` is on: only a holder that died, whose row
expires without a release, is found this way."""

POLL_JITTER = 0.5
"""Each delay is the cadence times a random factor in [1 - this, 1 + this], so that
waiters that started together do not try together for ever."""

WAKE_SPACING = 0.1
"""Seconds from one read that a wake-up prompted to the next: the wake-ups in
between are read once, together.  A release just after a read that found the
lease held is seen at most this much later."""

WAKE_READ_TIMEOUT = 2.0
"""Seconds a wake-up's read may take before it is cancelled; then the waiter
tries the lease, as it did before it read first."""


def jitter_delay(max_seconds: float, rng: random.Random | None = None) -> float:
    """The start-up jitter: a uniform delay in ``[0, max_seconds]``; zero when jitter is off."""
    return (rng or random).uniform(0.0, max_seconds) if max_seconds > 0 else 0.0


_WAKE_KEY = sql.Placeholder("wake_key")


def wake_payload(
    table_oid: sql.Composable, lock_row: sql.Composable = _WAKE_KEY, tag: str = ":"
) -> sql.Composed:
    """The ``NOTIFY`` payload that wakes the waiters of a lease, computed by the
    server: the lock table's oid (the same however it was named), ``tag`` (``:after:``
    for a success's, ``dislock.core.after``) and a digest of the lease's row key
    ``lock_row`` (payloads are limited to 8000 bytes, lock keys are not)."""
    return sql.SQL("{}::text || {} || encode(sha256(convert_to({}, 'UTF8')), 'hex')").format(
        table_oid, sql.Literal(tag), lock_row
    )


def wake_key(lock_key: str, mode: str = kinds.LEASE) -> str:
    """What a lease's wake payload digests: its plain lease row key, for every slot
    (a group's: its first slot's row key, ``mode`` ``group``)."""
    return kinds.BY_MODE[mode].row_key(lock_key)


class ListenRow(NamedTuple):
    """What a waiter's listening connection reads before it listens (``listen``)."""

    backend_pid: int
    """The server's process id of the connection: not the startup's behind a pooler."""
    wake: str
    """The payload a release of the lease sends (``wake_payload``)."""


def listen(
    table_parts: Sequence[str], lock_key: str, mode: str = kinds.LEASE
) -> Exchange[ListenRow]:
    """For a waiter's listening connection: its backend pid and the payload a
    release of ``lock_key``'s lease sends, computed by the server."""
    return listening(table_parts, wake_key(lock_key, mode))


def listening(table_parts: Sequence[str], digested: str, tag: str = ":") -> Exchange[ListenRow]:
    """A listening connection's backend pid, and the ``wake_payload`` of the table
    ``table_parts``, ``tag`` and ``digested``."""
    name = sql.Literal(sql.Identifier(*table_parts).as_string(None))
    oid = sql.SQL("{}::regclass::oid").format(name)
    columns = select_list(
        ListenRow._fields, backend_pid=sql.SQL("pg_backend_pid()"), wake=wake_payload(oid, tag=tag)
    )
    return Exchange(sql.SQL("SELECT {}").format(columns), {"wake_key": digested}, read_listen)


def read_listen(rows: Rows) -> ListenRow:
    """``listen``'s answer: its one row."""
    (row,) = rows
    found = ListenRow._make(row)
    return ListenRow(int(found.backend_pid), str(found.wake))


@functools.lru_cache(maxsize=64)
def held_query(table_parts: tuple[str, ...]) -> sql.Composed:
    """Whether every slot row of a lease is live, read by primary key when a
    ``NOTIFY`` wakes a waiter.  Params: keys (``slot_keys``), slots."""
    return sql.SQL(
        "SELECT count(*) >= %(slots)s FROM {} WHERE key = ANY(%(keys)s::text[])"
        " AND expire_at > NOW()"
    ).format(sql.Identifier(*table_parts))


def read_held(rows: Sequence[Sequence[object]]) -> bool:
    """``held_query``'s answer."""
    return bool(rows[0][0])


class WakeReads:
    """When a waiter woken by a ``NOTIFY`` may read the lease's rows next."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = -math.inf

    def pause(self, now: float) -> float:
        """Seconds to let wake-ups gather before reading (0: read now)."""
        return max(0.0, self._next - now)

    def read(self, now: float) -> None:
        """A read ended at ``now``."""
        self._next = now + WAKE_SPACING


def slot_keys(lock_key: str, slots: int, mode: str = kinds.LEASE) -> list[str]:
    """The row keys of a lease's slots, slot 1 first (the plain lease row: one slot is
    exactly the lease dislock 0.1.0 takes)."""
    lease = kinds.BY_MODE[mode]
    return [lease.row_key(lock_key, slot) for slot in range(1, slots + 1)]


def slot_retry(*, free: int, attempts: int, slots: int) -> bool:
    """Whether to send the slot-taking statement again at once after it took
    nothing although it found ``free`` slots (another holder took the one it
    picked); each retry follows someone else's success, so ``slots`` suffice."""
    return free > 1 and attempts < slots


def check_waiting(
    strategies: Iterable[str],
    wait_seconds: float,
    slots: int,
    replace: bool = False,
    group: bool = False,
    after: bool = False,
) -> None:
    """Waiting, slots and replacing need a kind held while the work runs (but a run
    may wait for its ``group`` or for the keys it comes ``after`` whatever it holds)."""
    chosen = [kinds.kind(name) for name in strategies]
    if wait_seconds > 0 and not (group or after) and not any(kind.can_wait for kind in chosen):
        raise ConfigurationError(
            f"waiting ({wait_seconds:g} s) needs the lease strategy: a schedule slot is "
            "taken once or skipped; use 'schedule,lease' to wait for the lease"
        )
    if slots > 1 and not any(kind.renewed for kind in chosen):
        raise ConfigurationError(
            f"{slots} slots need the lease strategy: a schedule slot has one start"
        )
    if replace and not any(kind.renewed for kind in chosen):
        raise ConfigurationError(
            "replacing the running holder needs the lease strategy: a schedule slot"
            " is started once; use 'schedule,lease' to replace the previous slot's run"
        )


class WaitPlan:
    """When a waiter tries next, and when it gives up."""

    __slots__ = ("_random", "deadline", "poll_seconds")

    def __init__(
        self,
        wait_seconds: float,
        *,
        started_at: float,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.deadline = started_at + wait_seconds
        self.poll_seconds = poll_seconds
        self._random = rand

    def next_delay(self, now: float, *, listening: bool) -> float | None:
        """Seconds to wait (for a wake-up, or at most) before the next try; None when
        the wait is over and the lock is to be skipped."""
        left = self.deadline - now
        if left <= 0:
            return None
        cadence = max(self.poll_seconds, SAFETY_POLL_SECONDS) if listening else self.poll_seconds
        factor = 1.0 + POLL_JITTER * (2.0 * self._random() - 1.0)
        return min(cadence * factor, left)
