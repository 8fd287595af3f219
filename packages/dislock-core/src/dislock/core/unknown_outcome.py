"""An acquisition whose answer was lost: whether it took a row, and how to find out.

The lock reconnects within its patience and reads its owner's live rows among the
keys it was taking (``LockStatements.mine``): a row found is the acquisition's if no
other acquisition can have written it (an owner this process made, a row it does
not hold, the slot end it sent); none found, the statement may be sent again
(docs/guarantees.md, "An acquiring statement whose answer was lost").
"""

from __future__ import annotations

import math
import os
import socket
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from time import monotonic
from typing import NamedTuple, TypeAlias

from psycopg import OperationalError

from dislock.core.errors import DatabaseUnreachableError

_CONNECTION_LOST_SQLSTATES = frozenset({"57P01", "57P02", "08000", "08003", "08006"})
"""admin_shutdown, crash_shutdown (the server ended the session: a terminated
backend, a fast shutdown) and the connection_exception class."""


def outcome_unknown(error: BaseException) -> bool:
    """Whether an acquiring statement that raised ``error`` may have taken effect: it
    lost its connection before the answer came.  (One cancelled after its timeout is
    not read after: stuck behind a locked row, the read would be stuck again.)"""
    if not isinstance(error, OperationalError) or isinstance(error, DatabaseUnreachableError):
        # (No connection could be opened for it: the statement was never sent.)
        return False
    sqlstate = getattr(error, "sqlstate", None)
    # No SQLSTATE: libpq's own failure (the server closed the connection,
    # "consuming input failed"), not an answer from the server.
    return sqlstate is None or sqlstate in _CONNECTION_LOST_SQLSTATES


def made_by_this_process(owner: str) -> bool:
    """Whether ``owner`` has the form ``default_owner`` gives it in this process."""
    parts = owner.rsplit(":", 2)
    if len(parts) != 3:
        return False
    host, pid, nonce = parts
    return (
        host == socket.gethostname()
        and pid == str(os.getpid())
        and len(nonce) == 8
        and all(c in "0123456789abcdef" for c in nonce)
    )


PRUNE_INTERVAL = 1.0
"""Seconds between two scans for what ``HeldRows`` may forget."""

_Row: TypeAlias = tuple[tuple[str, ...], str, str]
"""A row of a table: its table's name, its key and its owner."""

SLOT_MEMORY = timedelta(days=1)
"""How long past its end a schedule slot taken is remembered: the database clock
may be behind ours, and a live row of a slot that has ended here is not a new
acquisition's."""


class HeldRows:
    """The rows this process holds or let go of, by table, key and owner, for every
    thread and event loop: a lease let go while a read sent meanwhile may still see it
    live, a slot until ``SLOT_MEMORY`` after its end (instants on ``time.monotonic()``)."""

    def __init__(self, prune_interval: float = PRUNE_INTERVAL) -> None:
        self._guard = threading.Lock()
        self._prune_interval = prune_interval
        self._leases: set[_Row] = set()
        # Leases let go: until when a read may see them live, and when to forget them.
        self._left: dict[_Row, tuple[float, float]] = {}
        self._slots: dict[tuple[_Row, datetime], None] = {}
        self._pruned_at = -math.inf

    def add(
        self,
        table_parts: tuple[str, ...],
        key: str,
        owner: str,
        *,
        slot_end: datetime | None = None,
    ) -> None:
        """Remember a row taken: a lease (no ``slot_end``) until ``let_go``, a slot by its end."""
        with self._guard:
            self._add((table_parts, key, owner), slot_end)

    def _add(self, row: _Row, slot_end: datetime | None) -> None:
        if slot_end is None:
            self._leases.add(row)
            self._left.pop(row, None)
            return
        self._prune()
        self._slots[row, slot_end] = None

    def _prune(self) -> None:
        """Forget slots long over and leases no read can still be judged against, at
        most once per ``prune_interval`` (not a scan per row taken)."""
        now = monotonic()
        if now - self._pruned_at < self._prune_interval:
            return
        self._pruned_at = now
        for left in [row for row, (_, forget) in self._left.items() if forget <= now]:
            del self._left[left]
        today = datetime.now(timezone.utc)
        for slot in [slot for slot in self._slots if slot[1] + SLOT_MEMORY <= today]:
            del self._slots[slot]

    def let_go(
        self,
        table_parts: tuple[str, ...],
        key: str,
        owner: str,
        *,
        visible_until: float,
        forget_at: float,
    ) -> None:
        """A lease is no longer held: a read sent before ``visible_until`` may still
        have found it live; after ``forget_at`` no acquisition judging such a read
        can still be using it."""
        row = (table_parts, key, owner)
        with self._guard:
            self._leases.discard(row)
            self._prune()
            self._left[row] = (visible_until, forget_at)

    def claim(
        self,
        table_parts: tuple[str, ...],
        key: str,
        owner: str,
        *,
        read_sent_at: float,
        slot_end: datetime | None = None,
    ) -> bool:
        """Take the row found by a read sent at ``read_sent_at`` as this process's, if
        nothing else of this process can have written it; whether it did."""
        row = (table_parts, key, owner)
        with self._guard:
            if slot_end is None:
                if row in self._leases:
                    return False
                left = self._left.get(row)
                if left is not None and read_sent_at < left[0]:
                    return False
            elif (row, slot_end) in self._slots:
                return False
            self._add(row, slot_end)
            return True

    def __len__(self) -> int:
        with self._guard:
            return len(self._leases) + len(self._left) + len(self._slots)


HELD = HeldRows()  # the process's rows


class Mine(NamedTuple):
    """A live row of the owner found by ``LockStatements.mine``."""

    key: str
    token: int | None
    """Its fencing token (None without fencing)."""
    expire_at: datetime
    timeline: int | None
    """The server timeline the read ran on."""


class Verdict(NamedTuple):
    """What the read says the lost acquisition did."""

    taken: Mine | None
    """The row it took, if it took one."""
    send_again: bool
    """It took nothing: the statement may be sent again.  (Neither: an untrusted
    row of the owner was found; the lock is not acquired.)"""


def judge(
    found: Sequence[Mine],
    *,
    table_parts: tuple[str, ...],
    owner: str,
    read_sent_at: float,
    slot_ends: Sequence[datetime] | None = None,
    held: HeldRows = HELD,
) -> Verdict:
    """The verdict on the rows ``LockStatements.mine`` found by a read sent at
    ``read_sent_at``; a row taken is claimed in ``held``.  ``slot_ends``: those a
    schedule slot's statement was sent (None for a lease)."""
    if slot_ends is not None:
        # A row of another slot is not this statement's, nor a sign that it took one.
        found = [row for row in found if row.expire_at in slot_ends]
    if not found:
        return Verdict(None, send_again=True)
    if made_by_this_process(owner):
        for row in found:
            slot_end = None if slot_ends is None else row.expire_at
            if held.claim(
                table_parts, row.key, owner, read_sent_at=read_sent_at, slot_end=slot_end
            ):
                return Verdict(row, send_again=False)
    return Verdict(None, send_again=False)
