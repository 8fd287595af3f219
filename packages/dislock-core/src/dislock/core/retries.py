"""Retries within a schedule slot (``LockContext.retries``): the slot row as the
slot's ledger, the statements that take an attempt and reopen a slot, and the
backoff between attempts (docs/design.md, "Retries within a slot").

A failed attempt with attempts left *reopens* the slot row (``expire_at`` moved back
to the retry time, a mark naming the slot), so that the next attempt takes it with
the upsert that takes any expired row.  A vanished holder reopens nothing: its slot
is taken over only when its lease proves the command gone (``vanished``; a success
is marked, ``DONE_MARK``, so as not to read so).  A start deadline (``LATE_MARK``)
uses the same row.

``dislockctl rerun`` (``rerun``, docs/operator.md) reopens the slot row as a failed
attempt would, as the run of an attempt 0: a job with retries takes it as attempt 1 of
a fresh count, one without as any expired row.  It refuses while a run of the key
holds its lease, which would take the slot and then find the lease held.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import NamedTuple

from psycopg import sql

from dislock.core.errors import ConfigurationError
from dislock.core.exchange import Exchange, Rows, select_list
from dislock.core.kinds import SCHEDULE
from dislock.core.rows import lease_key, schedule_key

DONE_MARK = " (done)"
"""Follows the attempt in the slot row of a ``schedule,lease`` job once the attempt
succeeded, before its lease is released: a lease left unreleased after a success
then proves nothing, and the slot is not retried."""

LATE_MARK = " (late)"
"""Follows the owner token in the row of a slot marked late (past its start
deadline): no acquisition starts the slot."""

MAX_BACKOFF_DOUBLINGS = 10
"""The delay doubles after each failed attempt, ten times at most (1024 times the delay)."""

_ATTEMPT = r" \(attempt (\d{1,9})\)"
"""How the attempt follows the owner token in ``value`` (a regular expression)."""


def attempt_suffix(attempt: int) -> str:
    """What follows the owner token in the row of ``attempt``: nothing for the first."""
    return "" if attempt <= 1 else f" (attempt {attempt})"


def reopened_suffix(slot_end: datetime) -> str:
    """The mark a failed attempt leaves in its row for the slot ending at ``slot_end``."""
    return f" (failed; retry in slot {int(slot_end.timestamp())})"


def backoff(delay: float, attempt: int) -> float:
    """Seconds between the end of failed ``attempt`` and the start of the next:
    ``delay`` after the first, doubling after each one after it."""
    return delay * float(2 ** min(max(attempt - 1, 0), MAX_BACKOFF_DOUBLINGS))


def _attempt_of(value: sql.Composable) -> sql.Composed:
    return sql.SQL("COALESCE((regexp_match({value}, {pattern}))[1]::int, 1)").format(
        value=value, pattern=sql.Literal(_ATTEMPT + r"(?: \(failed; retry in slot \d+\))?$")
    )


def _owner_of(value: sql.Composable) -> sql.Composed:
    return sql.SQL("regexp_replace({value}, {pattern}, '')").format(
        value=value, pattern=sql.Literal(_ATTEMPT + "$")
    )


def _delay_of(attempt: sql.Composable) -> sql.Composed:
    return sql.SQL(
        "make_interval(secs => %(delay)s * power(2, least({attempt} - 1, {doublings})))"
    ).format(attempt=attempt, doublings=sql.Literal(MAX_BACKOFF_DOUBLINGS))


def vanished(row: str, table: sql.Identifier) -> sql.Composed:
    """Whether the slot row ``row`` (an alias) is this slot's, taken by an attempt
    whose lease row (``%(lease)s``) is still its own, unreleased, and expired for
    the retry delay: its holder vanished."""
    return sql.SQL(
        "({row}.expire_at = %(expire_at)s AND right({row}.value, length(%(reopened)s))"
        " <> %(reopened)s AND right({row}.value, {done_length}) <> {done}"
        " AND %(lease)s::text IS NOT NULL AND EXISTS (SELECT FROM {table} AS gone"
        " WHERE gone.key = %(lease)s AND gone.value = {owner}"
        " AND gone.expire_at <= NOW() - {delay}))"
    ).format(
        row=sql.Identifier(row),
        done=sql.Literal(DONE_MARK),
        done_length=sql.Literal(len(DONE_MARK)),
        table=table,
        owner=_owner_of(sql.SQL("{}.value").format(sql.Identifier(row))),
        delay=_delay_of(_attempt_of(sql.SQL("{}.value").format(sql.Identifier(row)))),
    )


GRACE_SHARE = 4
"""The machine whose attempt failed leaves the retry to the others for at most
1/GRACE_SHARE of what is left of the slot after the retry time (``grace``)."""

GRACE_CAP = 300.0
"""…and for at most this many seconds: five ticks of a crontab line run every minute."""


def grace(delay: float, retry_at: datetime, slot_end: datetime) -> float:
    """Seconds after ``retry_at`` during which the machine whose attempt failed
    (``delay``: that attempt's backoff) leaves the retry to another: the backoff, so
    that a delay of a tick gives the others one; at most a share of the slot left, so
    that the failed machine's own retry keeps most of it; at most ``GRACE_CAP``."""
    left = max((slot_end - retry_at).total_seconds(), 0.0)
    return min(delay, left / GRACE_SHARE, GRACE_CAP)


def _failed_here(value: sql.Composable) -> sql.Composed:
    """Whether the slot row ``value`` was left by an attempt of the claimant's machine:
    its owner token starts with the host name that starts ``%(owner)s`` (the default
    ``hostname:pid:nonce`` token; a token without a colon names no machine)."""
    return sql.SQL("starts_with({value}, split_part(%(owner)s, ':', 1) || ':')").format(value=value)


def next_attempt(table: sql.Identifier) -> sql.Composed:
    """The ``prior`` and ``attempt`` CTEs of a retrying claim: the slot row as found,
    the attempt a claim would be (``n``, NULL: none may start now), and when a reopened
    slot's next attempt may start (``retry_at``).  The machine whose attempt failed is
    ``deferred`` (the attempt it leaves to another) until the row's expiry plus its
    ``grace``."""
    reopened_here = sql.SQL("right(prior.value, length(%(reopened)s)) = %(reopened)s")
    grace_end = sql.SQL(
        "prior.expire_at + least({delay},"
        " (%(expire_at)s::timestamptz - prior.expire_at) / {share},"
        " make_interval(secs => {cap}))"
    ).format(
        delay=_delay_of(_attempt_of(sql.SQL("prior.value"))),
        share=sql.Literal(GRACE_SHARE),
        cap=sql.Literal(GRACE_CAP),
    )
    return sql.SQL(
        "prior AS (SELECT value, expire_at, {reopened_here} AND {failed_here}"
        " AND NOW() < {grace_end} AS deferred, {grace_end} AS grace_end"
        " FROM {table} AS prior WHERE key = %(key)s),"
        " attempt AS (SELECT CASE"
        " WHEN NOT EXISTS (SELECT FROM prior) THEN 1"
        " ELSE (SELECT CASE"
        " WHEN prior.deferred THEN NULL"
        " WHEN prior.expire_at <= NOW() AND {reopened_here} THEN {attempt} + 1"
        " WHEN prior.expire_at <= NOW() THEN 1"
        " WHEN {vanished} THEN {attempt} + 1"
        " END FROM prior) END AS n,"
        " (SELECT CASE WHEN prior.deferred THEN {attempt} + 1 END FROM prior) AS deferred,"
        " (SELECT CASE WHEN prior.deferred THEN prior.grace_end"
        " WHEN prior.expire_at > NOW() AND {reopened_here}"
        " THEN prior.expire_at END FROM prior) AS retry_at)"
    ).format(
        table=table,
        reopened_here=reopened_here,
        failed_here=_failed_here(sql.SQL("prior.value")),
        grace_end=grace_end,
        attempt=_attempt_of(sql.SQL("prior.value")),
        vanished=vanished("prior", table),
    )


def claimable(table: sql.Identifier) -> sql.Composed:
    """The retrying upsert's condition on the row in its way (``held``): the row the
    statement read (whose attempt it counted), expired or left by a vanished holder."""
    return sql.SQL(
        "held.value = (SELECT value FROM prior) AND (held.expire_at <= NOW() OR {vanished})"
    ).format(vanished=vanished("held", table))


def claim_params(
    lease: str | None, slot_end: datetime, retries: int, delay: float
) -> dict[str, object]:
    """The parameters a retrying claim adds to ``acquire_until``'s."""
    return {
        "lease": lease,
        "reopened": reopened_suffix(slot_end),
        "attempts": retries + 1,
        "delay": delay,
    }


def reopen_query(table: sql.Identifier) -> sql.Composed:
    """Reopens the slot for its next attempt at ``NOW() + delay``, unless the slot
    ends first; answers that moment, or no row."""
    return sql.SQL(
        "UPDATE {table} SET value = value || %(reopened)s,"
        " expire_at = NOW() + make_interval(secs => %(delay)s)"
        " WHERE key = %(key)s AND value = %(value)s AND expire_at = %(expire_at)s"
        " AND NOW() + make_interval(secs => %(delay)s) < %(expire_at)s"
        " RETURNING expire_at"
    ).format(table=table)


def done_query(table: sql.Identifier) -> sql.Composed:
    """Marks the slot's successful attempt done (``DONE_MARK``)."""
    return sql.SQL(
        "UPDATE {table} SET value = value || {done}"
        " WHERE key = %(key)s AND value = %(value)s AND expire_at = %(expire_at)s"
    ).format(table=table, done=sql.Literal(DONE_MARK))


def done(query: sql.Composed, key: str, value: str, slot_end: datetime) -> Exchange[None]:
    """Mark the slot ending ``slot_end`` done by the attempt that took it as ``value``."""
    params = {"key": key, "value": value, "expire_at": slot_end}
    return Exchange(query, params, lambda rows: None)


def reopen(
    query: sql.Composed, key: str, value: str, slot_end: datetime, delay: float
) -> Exchange[datetime | None]:
    """Reopen the slot ending ``slot_end`` that an attempt (its row ``value``) failed
    in, ``delay`` seconds from now: when the next attempt may start, or None."""
    params = {
        "key": key,
        "value": value,
        "expire_at": slot_end,
        "reopened": reopened_suffix(slot_end),
        "delay": delay,
    }
    return Exchange(query, params, lambda rows: rows[0][0] if rows else None)


_ENDED = {"lease_lost": "lost its lease", "killed": "was killed", "timed_out": "ran too long"}


def attempt_ended(lock_key: str, attempt: int, retries: int, outcome: str) -> str:
    """The start of the line that says a slot's attempt ended with ``outcome``."""
    how = _ENDED.get(outcome, "failed")
    return f"lock {lock_key!r}: attempt {attempt} of {retries + 1} in this slot {how}"


MARKS = (" (attempt ", " (failed; retry in slot ", LATE_MARK, DONE_MARK)
"""What the slot row's ``value`` may carry after the owner token."""


def check_owner(owner: str) -> None:
    """An owner token that holds a mark would be read as one: an owner ending in
    ``(attempt 0)`` would make every attempt the first."""
    for mark in MARKS:
        if mark in owner:
            raise ConfigurationError(
                f"owner must not contain {mark.strip()!r} with retries or a start deadline:"
                " the slot row writes that after the owner"
            )


def check_retries(
    strategies: Sequence[str],
    retries: int,
    start_deadline: float | None = None,
    *,
    names: tuple[str, str] = ("retries", "start_deadline_seconds"),
) -> None:
    """Retries and a start deadline are a schedule slot's: a lease alone has no slot
    to retry in or to start late."""
    if SCHEDULE in strategies:
        return
    if retries > 0:
        raise ConfigurationError(
            f"{names[0]} ({retries}) need the schedule strategy: a retry is another attempt"
            " in the same schedule slot; use 'schedule' or 'schedule,lease'"
        )
    if start_deadline is not None:
        raise ConfigurationError(
            f"{names[1]} needs the schedule strategy: it bounds how late a schedule slot may"
            " start; use 'schedule' or 'schedule,lease'"
        )


class Rerun(NamedTuple):
    """What the rerun statement found and did: the row it answers."""

    value: str | None
    """The slot row's value before (None: the key has no slot row)."""
    expire_at: datetime | None
    leased_by: str | None
    """The owner of a live lease of the key, which kept the slot as it was."""
    reopened: bool
    now: datetime


def _read_rerun(rows: Rows) -> Rerun:
    (row,) = rows
    found = Rerun._make(row)
    return found._replace(reopened=bool(found.reopened))


def rerun(table_parts: tuple[str, ...], lock_key: str) -> Exchange[Rerun]:
    """Open ``lock_key``'s live slot row for one more run, now, unless its lease is
    held (one statement; the role that runs it is named in the row)."""
    table = sql.Identifier(*table_parts)
    query = sql.SQL(
        "WITH before AS (SELECT value, expire_at FROM {table} WHERE key = %(key)s),"
        " leased AS (SELECT value FROM {table} WHERE key = %(lease)s AND expire_at > NOW()),"
        " reopened AS (UPDATE {table}"
        " SET value = 'rerun by ' || current_user || ' (attempt 0) (failed; retry in slot '"
        " || COALESCE((regexp_match(value, {slot}))[1],"
        " floor(extract(epoch FROM expire_at))::bigint::text)"
        " || ')', expire_at = NOW()"
        " WHERE key = %(key)s AND expire_at > NOW() AND NOT EXISTS (SELECT FROM leased)"
        " RETURNING key)"
        " SELECT {columns}"
    ).format(
        table=table,
        slot=sql.Literal(r" \(failed; retry in slot (\d+)\)$"),
        columns=select_list(
            Rerun._fields,
            value=sql.SQL("(SELECT value FROM before)"),
            expire_at=sql.SQL("(SELECT expire_at FROM before)"),
            leased_by=sql.SQL("(SELECT value FROM leased)"),
            reopened=sql.SQL("EXISTS (SELECT FROM reopened)"),
            now=sql.SQL("NOW()"),
        ),
    )
    params = {"key": schedule_key(lock_key), "lease": lease_key(lock_key)}
    return Exchange(query, params, _read_rerun)


def slot_end_of(value: str, expire_at: datetime) -> datetime:
    """The end of the slot a live slot row stands for: the slot its reopened mark
    names, else its ``expire_at`` (a taken slot row expires as its slot ends)."""
    return reopened_slot(value) or expire_at


def reopened_slot(value: str) -> datetime | None:
    """The end of the slot a slot row's value says is reopened for another attempt
    (by a failed attempt or a rerun), or None."""
    found = re.search(r" \(failed; retry in slot (\d{1,11})\)$", value)
    if found is None:
        return None
    try:
        return datetime.fromtimestamp(int(found.group(1)), timezone.utc)
    except (OverflowError, OSError, ValueError):  # a mark written by hand
        return None


def waiting(table_parts: tuple[str, ...], lock_key: str) -> Exchange[datetime | None]:
    """The end of ``lock_key``'s slot whose row waits for another attempt, if one does."""
    query = sql.SQL("SELECT value FROM {} WHERE key = %(key)s").format(sql.Identifier(*table_parts))

    def read(rows: Rows) -> datetime | None:
        return reopened_slot(rows[0][0]) if rows else None

    return Exchange(query, {"key": schedule_key(lock_key)}, read)
