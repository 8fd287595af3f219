"""An acquisition whose answer was lost: whether it took a row, and how to find out.

When the connection breaks while an acquiring statement is in flight (a
failover restarts the server under it, a network drops), the statement may have
committed or not.  Sending it again blindly is wrong either way it went: a row
the first send took refuses the second (every acquisition refuses a live row,
its owner's too), so the lock would report itself held by another owner, and a
schedule slot it took would go by without the job.  So the lock reconnects within its patience
(``dislock.core.patience``) and reads its owner's live rows among the keys it
was taking (``Statements.mine``): a row found is the acquisition's, none found
means nothing was taken and the statement may be sent again.

A row of the owner proves the acquisition only if no other acquisition can have
written it, so the read is trusted only when

* the owner is one this process made (``default_owner``: host name, pid and a
  nonce); an owner chosen by the user may be shared by several machines, and
  its row may be another machine's lease; and
* this process does not hold that row already (``HELD``): another lock built
  from the same ``LockContext`` (a second run in one schedule slot, a second
  ``LeaseLock`` at once) writes the same owner.

An untrusted row counts as held by someone else: the acquisition reports the
lock as not acquired, which is what it would have said had the first send
taken nothing.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, NamedTuple

from psycopg import OperationalError

_CONNECTION_LOST_SQLSTATES = frozenset({"57P01", "57P02", "08000", "08003", "08006"})
"""admin_shutdown, crash_shutdown (the server ended the session: a terminated
backend, a fast shutdown) and the connection_exception class."""


def outcome_unknown(error: BaseException) -> bool:
    """Whether an acquiring statement that raised ``error`` may have taken effect: it
    lost its connection before the answer came.  A statement the server answered
    with an error (a SQLSTATE of its own) did nothing, and so did one cancelled
    after its timeout (``StatementTimeout``: the server confirmed the cancel, and
    a statement stuck behind a locked row would only be stuck again)."""
    if not isinstance(error, OperationalError):
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


class HeldRows:
    """The rows this process holds, by table, key and owner: a lease until it is
    left, a schedule slot until its end.  Shared by every thread and event loop."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._leases: set[tuple[tuple[str, ...], str, str]] = set()
        self._slots: dict[tuple[tuple[str, ...], str, str], datetime] = {}

    def add(
        self, table_parts: tuple[str, ...], key: str, owner: str, until: datetime | None = None
    ) -> None:
        """Remember a row taken: a slot until ``until``, a lease (None) until ``discard``."""
        row = (table_parts, key, owner)
        with self._guard:
            if until is None:
                self._leases.add(row)
                return
            # Slots that ended are forgotten as new ones come: the map stays small.
            now = datetime.now(timezone.utc)
            for old in [old for old, ends in self._slots.items() if ends <= now]:
                del self._slots[old]
            self._slots[row] = until

    def discard(self, table_parts: tuple[str, ...], key: str, owner: str) -> None:
        with self._guard:
            self._leases.discard((table_parts, key, owner))

    def holds(self, table_parts: tuple[str, ...], key: str, owner: str) -> bool:
        row = (table_parts, key, owner)
        with self._guard:
            if row in self._leases:
                return True
            ends = self._slots.get(row)
        return ends is not None and ends > datetime.now(timezone.utc)

    def __len__(self) -> int:
        with self._guard:
            return len(self._leases) + len(self._slots)


HELD = HeldRows()
"""The process's rows (see the module's docstring)."""


class Mine(NamedTuple):
    """A live row of the owner found by ``Statements.mine``."""

    key: str
    token: int | None
    """Its fencing token (None without fencing)."""
    expire_at: datetime
    timeline: int | None
    """The server timeline the read ran on."""


def parse_mine(rows: Sequence[Sequence[Any]]) -> list[Mine]:
    return [Mine(str(key), token, expire_at, timeline) for key, token, expire_at, timeline in rows]


class Verdict(NamedTuple):
    """What the read says the lost acquisition did."""

    taken: Mine | None
    """The row it took, if it took one."""
    send_again: bool
    """It took nothing: the statement may be sent again.  (Neither: an untrusted
    row of the owner was found; the lock is not acquired.)"""


def judge(
    found: Sequence[Mine], *, table_parts: tuple[str, ...], owner: str, held: HeldRows = HELD
) -> Verdict:
    """The verdict on the rows ``Statements.mine`` found (see the module's docstring)."""
    if not found:
        return Verdict(None, send_again=True)
    if made_by_this_process(owner):
        for row in found:
            if not held.holds(table_parts, row.key, owner):
                return Verdict(row, send_again=False)
    return Verdict(None, send_again=False)
