"""A schedule slot that starts only after other keys succeeded in it
(``LockContext.after``, ``LOCK_AFTER``; docs/cli.md, "After other jobs"): the check,
its statement, its wake-up and the event row of a slot held back.

A slot of a job with ``after`` starts only once each key named has a run that
succeeded (history outcome ``ok``) and started at or after the slot's own start.
The history already holds that: one index read per key, sent before the slot is
claimed, so that a slot held back stays open and nothing is written.  A waiting job
is woken by the end statement of a successful run (``success_notice``), as a release
wakes a lease's waiters, and polls as well.

Without a lock row, a slot held back all along would read as one nobody started: so
the first refusal in a slot records one event row (``record_start``, inserted only
while the slot has none, then ``record_end``: ended as it started, as an operator's
event is, since a granted role may insert a row's start columns, then end it, not
both at once).  Two refusals at the same instant may each write one; readers count
the slot once.  A role granted before the outcome existed ends it ``late`` instead
(``LATE_FALLBACK``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from psycopg import sql

from dislock.core import bounds
from dislock.core.errors import ConfigurationError, LockNotAcquiredError
from dislock.core.exchange import Exchange, Rows
from dislock.core.waiting import WAKE_CHANNEL, ListenRow, listening, wake_payload

SUCCEEDED = "ok"  # the history outcome of a run that succeeded


class DependencyPending(LockNotAcquiredError):
    """A schedule slot held back: ``key`` has no successful run started in it yet.
    A ``LockNotAcquiredError``, so that code skipping a taken slot skips it too."""

    def __init__(
        self,
        message: str,
        *,
        key: str,
        slot_start: datetime | None = None,
        slot_end: datetime | None = None,
    ) -> None:
        super().__init__(message)
        self.key = key
        """The first key named in ``after`` that the slot still waits for."""
        self.slot_start = slot_start
        self.slot_end = slot_end
        """The slot held back (``record_start`` records it)."""


def check_after(
    after: object,
    *,
    history: bool,
    schedule: str | None,
    names: tuple[str, str, str] = ("after", "history=True", "schedule and the schedule strategy"),
) -> tuple[str, ...]:
    """``after`` as a tuple of keys, checked: it needs the history (where successes
    are read) and a schedule (a slot's start is its cron fire).  ``names``: the
    setting, the history and the schedule as the caller spelled them."""
    if isinstance(after, str) or not isinstance(after, Sequence):
        raise ConfigurationError(f"{names[0]} must be a list of lock keys, got {after!r}")
    keys = tuple(after)
    for key in keys:
        bounds.check_key(names[0], key)
    if not keys:
        return keys
    if len(set(keys)) != len(keys):
        raise ConfigurationError(f"{names[0]} names a key twice: {', '.join(keys)}")
    if not history:
        raise ConfigurationError(
            f"{names[0]} reads the keys' successful runs from the history: it needs {names[1]}"
        )
    if schedule is None:
        raise ConfigurationError(
            f"{names[0]} holds a schedule slot back until the keys succeeded in it:"
            f" it needs {names[2]}"
        )
    return keys


def parse_after(raw: str) -> tuple[str, ...]:
    """``LOCK_AFTER``'s text: keys separated by commas (blanks around them dropped)."""
    keys = tuple(key.strip() for key in raw.split(","))
    if not all(keys):
        raise ConfigurationError("an empty key between commas")
    return keys


# A success's wake-up is a release's (``dislock.core.waiting.wake_payload``) but
# for its tag: a lease's row keys all start with ``cronjob-lock:``, never ``after:``.
_TAG = ":after:"


def success_notice() -> sql.Composed:
    """What the history's end statement returns: a wake-up of the jobs waiting for
    the row's key, sent (at commit) when the run succeeded, and only then."""
    return sql.SQL(
        "CASE WHEN outcome = {ok} THEN pg_notify({channel}, {payload}) END AS woken"
    ).format(
        ok=sql.Literal(SUCCEEDED),
        channel=sql.Literal(WAKE_CHANNEL),
        payload=wake_payload(sql.SQL("tableoid"), sql.SQL("lock_key"), _TAG),
    )


def listen_after(history: Sequence[str], key: str) -> Exchange[ListenRow]:
    """For a waiting job's listening connection: its backend pid, and the payload
    a success of ``key`` sends."""
    return listening(history, key, _TAG)


def pending(history: Sequence[str], keys: Sequence[str], since: datetime) -> Exchange[str | None]:
    """The first of ``keys`` without a successful run started at ``since`` or later
    (None: every one has one); an index read per key."""
    query = sql.SQL(
        "SELECT dep.key FROM unnest(%(keys)s::text[]) WITH ORDINALITY AS dep (key, n)"
        " WHERE NOT EXISTS (SELECT FROM {} AS run WHERE run.lock_key = dep.key"
        " AND run.started_at >= %(since)s AND run.outcome = {ok})"
        " ORDER BY dep.n LIMIT 1"
    ).format(sql.Identifier(*history), ok=sql.Literal(SUCCEEDED))
    return Exchange(query, {"keys": list(keys), "since": since}, read_pending)


def read_pending(rows: Rows) -> str | None:
    """``pending``'s answer."""
    return str(rows[0][0]) if rows else None


def held_back(lock_key: str, key: str, began: datetime, expires_at: datetime) -> DependencyPending:
    """The refusal of a slot that waits for ``key``."""
    return DependencyPending(
        f"schedule slot of {lock_key!r} ending {expires_at.isoformat()} waits for {key!r}:"
        f" no run of it that started since {began.isoformat(timespec='seconds')} (the slot's"
        " start) has succeeded",
        key=key,
        slot_start=began,
        slot_end=expires_at,
    )


HELD_BACK = "held_back"  # the outcome of a held-back slot's event row

MODES = "after"
"""The ``modes`` of that row: no run's (``schedule``, ``lease``) nor a pause's."""

LATE_FALLBACK = "late"
"""The outcome written instead when the role may not write ``held_back``."""

_WAITING = "waiting for "


def owner_of(key: str) -> str:
    """The row's ``owner``: the key the slot waited for."""
    return f"{_WAITING}{key}"


def waited_for(owner: str | None) -> str | None:
    """The key a held-back row's ``owner`` names (None: not one of ours)."""
    if owner is None or not owner.startswith(_WAITING):
        return None
    return owner[len(_WAITING) :]


def record_start(
    history: tuple[str, ...],
    *,
    lock_key: str,
    key: str,
    slot_start: datetime,
    slot_end: datetime,
    host: str,
    pid: int,
    cron: str | None,
    cron_tz: str | None,
) -> Exchange[int | None]:
    """Insert the start of the held-back event of the slot ``slot_start`` to
    ``slot_end`` of ``lock_key``, waiting for ``key``, unless the slot has one: the
    new row's id, or None (already recorded)."""
    from dislock.core import history_functions
    from dislock.core.history import ASYNC_COMMIT

    query = sql.SQL(
        "INSERT INTO {table} (lock_key, modes, slot_end, owner, host, pid, started_at, cron,"
        " cron_tz) SELECT %(lock_key)s, {modes}, %(slot_end)s, %(owner)s, %(host)s, %(pid)s,"
        " NOW(), %(cron)s, %(cron_tz)s FROM {async_commit}"
        " WHERE NOT EXISTS (SELECT FROM {table} AS e WHERE e.lock_key = %(lock_key)s"
        " AND e.started_at >= %(slot_start)s AND e.modes = {modes}"
        " AND e.slot_end = %(slot_end)s)"
        " RETURNING id"
    ).format(table=sql.Identifier(*history), modes=sql.Literal(MODES), async_commit=ASYNC_COMMIT)
    params = {
        "lock_key": lock_key,
        "slot_start": slot_start,
        "slot_end": slot_end,
        "owner": owner_of(key),
        "host": host,
        "pid": pid,
        "cron": cron,
        "cron_tz": cron_tz,
    }
    plain = Exchange(query, params, lambda rows: int(rows[0][0]) if rows else None)
    return history_functions.via(history, "held_back", plain, outcome=HELD_BACK)


def record_end(history: tuple[str, ...], run_id: int, outcome: str = HELD_BACK) -> Exchange[None]:
    """The event's row ended as it started, with ``outcome`` (``HELD_BACK``, or
    ``LATE_FALLBACK`` for a role granted before it)."""
    from dislock.core import history_functions
    from dislock.core.history import ASYNC_COMMIT

    query = sql.SQL(
        "UPDATE {} SET ended_at = started_at, outcome = %(outcome)s FROM {async_commit}"
        " WHERE id = %(id)s AND ended_at IS NULL"
    ).format(sql.Identifier(*history), async_commit=ASYNC_COMMIT)
    plain: Exchange[None] = Exchange(query, {"id": run_id, "outcome": outcome}, lambda rows: None)
    # (Through the function, the event's row was written ended: nothing left to do.)
    return history_functions.via(history, "end", plain)


def refused(error: BaseException) -> bool:
    """Whether the end failed because the role may not write the outcome (a grant
    from before it): insufficient_privilege, row-level security's refusal too."""
    return getattr(error, "sqlstate", None) == "42501"
