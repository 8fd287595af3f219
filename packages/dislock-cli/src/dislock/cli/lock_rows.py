"""The lock rows as ``dislockctl`` reads and force-releases them, each statement an
exchange (``dislock.core.exchange``) whose reader returns typed rows; how they are
shown is ``dislock.cli.admin``'s."""

from __future__ import annotations

import socket
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple

from psycopg import sql

from dislock.cli.far_times import iso
from dislock.cli.shown import cut, read, was_cut
from dislock.core import kinds
from dislock.core.exchange import Exchange, Rows, select_list
from dislock.core.rows import FORCED_BY, RELEASED_MARK, forced_mark_of, pause_key
from dislock.core.waiting import WAKE_CHANNEL, wake_key, wake_payload

PAUSE = "pause"
"""The mode ``ls`` gives a pause row (``dislockctl pause``)."""

RUNNING, SLOT_TAKEN, WAITING = "running", "slot taken", "waiting for group"
"""What a held row says of its run (``LockRow.activity``): a lease's run runs, or waits
for a slot of its group; a schedule row only that its slot is taken, until the slot
ends, whether or not a run still goes on in it."""


class RowState(NamedTuple):
    """A lock row's owner (a pause's reason) and its seconds left (<= 0: not live): the
    row ``states`` answers, and what ``forced_release`` says of each row it ended."""

    key: str
    owner: str
    seconds_left: float


class ReleasedRow(NamedTuple):
    """The row ``forced_release`` answers for each row it ended (its owner before the
    mark, the seconds it had left; ``woken``: for the wake-up it sends)."""

    key: str
    owner: str
    seconds_left: float
    woken: object


class ListedRow(NamedTuple):
    """The row ``listing`` answers, before ``LockRow.from_row`` reads it."""

    key: str
    value: str
    expire_at: datetime
    expires_in_seconds: float
    fence: int | None


def columns(table_parts: tuple[str, ...]) -> Exchange[list[str]]:
    """The lock table's column names, from the catalog (no rights on the table needed);
    none if the table does not exist."""
    query = sql.SQL(
        "SELECT attname FROM pg_attribute"
        " WHERE attrelid = to_regclass(%(table)s) AND attnum > 0 AND NOT attisdropped"
        " ORDER BY attnum"
    )
    table = sql.Identifier(*table_parts).as_string(None)
    return Exchange(query, {"table": table}, lambda rows: [str(name) for (name,) in rows])


_SECONDS_LEFT = sql.SQL("(EXTRACT(EPOCH FROM expire_at) - EXTRACT(EPOCH FROM NOW()))::float8")
"""A lock row's seconds left on the database clock (<= 0: not live)."""


@lru_cache(maxsize=16)
def _list_query(table_parts: tuple[str, ...]) -> sql.Composed:
    # ``fence`` is read through ``to_jsonb`` so that one query serves tables with
    # and without the fencing column.
    columns = select_list(
        ListedRow._fields,
        key=read("key"),
        value=read("value"),
        expire_at=sql.SQL("expire_at"),
        expires_in_seconds=_SECONDS_LEFT,
        fence=sql.SQL("(to_jsonb(held) ->> 'fence')::bigint"),
    )
    return sql.SQL(
        "SELECT {columns}"
        " FROM {table} AS held"
        " WHERE EXISTS (SELECT FROM unnest(%(prefixes)s::text[]) AS p (prefix)"
        " WHERE starts_with(key, p.prefix))"
        " OR (key ~ %(slot_pattern)s"
        " AND starts_with(regexp_replace(key, %(slot_pattern)s, ''), %(prefix)s))"
        # A pause that ran out is inert: not shown.
        " OR (starts_with(key, %(pause_prefix)s) AND expire_at > NOW())"
        # The stored key: a bare ``key`` would name the column read of it (ORDER BY
        # takes an output column's name first).
        " ORDER BY held.key"
    ).format(table=sql.Identifier(*table_parts), columns=columns)


def listing(table_parts: tuple[str, ...], prefix: str = "") -> Exchange[list[LockRow]]:
    """Every lock row whose lock key starts with ``prefix``, on the database clock (every
    kind's rows, N-holder leases' extra slots, live pauses), in ``LISTED_MODES`` order."""
    params = {
        "prefixes": [kind.row_key(prefix) for kind in kinds.BY_MODE.values()],
        "prefix": prefix,
        "slot_pattern": _slot_pattern(tuple(kinds.BY_MODE)),
        "pause_prefix": pause_key(prefix),
    }
    return Exchange(_list_query(table_parts), params, _read_lock_rows)


def _read_lock_rows(rows: Rows) -> list[LockRow]:
    # Not in the rows' own order (ORDER BY key), which lists every key's lease, then
    # every pause, then every schedule slot: each lock key's rows together.
    return sorted((LockRow.from_row(ListedRow._make(row)) for row in rows), key=_listed_order)


LISTED_MODES = (*kinds.NAMES, PAUSE, kinds.GROUP.name)
"""The order of one lock key's rows in ``listing``: its schedule slot, its lease (and
the lease's slots), its pause; a row of no known mode last."""


def _listed_order(row: LockRow) -> tuple[str, int, int]:
    rank = LISTED_MODES.index(row.mode) if row.mode in LISTED_MODES else len(LISTED_MODES)
    return (row.lock_key, rank, row.slot)


@lru_cache(maxsize=16)
def _state_query(table_parts: tuple[str, ...]) -> sql.Composed:
    columns = select_list(
        RowState._fields, key=read("key"), owner=read("value"), seconds_left=_SECONDS_LEFT
    )
    return sql.SQL("SELECT {columns} FROM {table} WHERE key = ANY(%(keys)s)").format(
        table=sql.Identifier(*table_parts), columns=columns
    )


def states(table_parts: tuple[str, ...], keys: Sequence[str]) -> Exchange[list[RowState]]:
    """The owner and seconds left of each row among ``keys`` that exists."""
    return Exchange(_state_query(table_parts), {"keys": list(keys)}, _read_states)


def _read_states(rows: Rows) -> list[RowState]:
    # The first three columns of a ``ReleasedRow`` too.
    return [RowState(cut(key), cut(owner), float(left)) for key, owner, left, *_ in rows]


def _slot_pattern(modes: Sequence[str]) -> str | None:
    """A regular expression matching the mode part of slot rows 2..N of ``modes``."""
    slotted = [kinds.BY_MODE[mode].mode for mode in modes if kinds.BY_MODE[mode].renewed]
    return f"^{kinds.KEY_PREFIX}:({'|'.join(slotted)})#[0-9]+:" if slotted else None


@lru_cache(maxsize=16)
def _release_query(table_parts: tuple[str, ...]) -> sql.Composed:
    return sql.SQL(
        "WITH target AS ("
        " SELECT key, value, expire_at FROM {table}"
        " WHERE (key = ANY(%(keys)s) OR (key ~ %(slot_pattern)s"
        " AND regexp_replace(key, %(slot_pattern)s, '') = %(lock_key)s))"
        " AND expire_at > NOW() AND (%(owner)s::text IS NULL OR value = %(owner)s::text)"
        " FOR UPDATE)"
        # Marked, so that ls and the holder tell a forced release from an abandoned
        # lease, and say who released it.
        " UPDATE {table} AS held SET expire_at = NOW(),"
        " value = held.value || {mark} || current_user || ' on ' || %(host)s || ')' FROM target"
        " WHERE held.key = target.key"
        " RETURNING {columns}"
    ).format(
        table=sql.Identifier(*table_parts),
        mark=sql.Literal(FORCED_BY),
        columns=select_list(
            ReleasedRow._fields,
            key=read(sql.SQL("held.key")),
            owner=read(sql.SQL("target.value")),
            seconds_left=sql.SQL(
                "(EXTRACT(EPOCH FROM target.expire_at) - EXTRACT(EPOCH FROM NOW()))::float8"
            ),
            woken=sql.SQL("pg_notify(%(channel)s, {})").format(
                wake_payload(sql.SQL("held.tableoid"))
            ),
        ),
    )


def release_keys(lock_key: str, modes: Sequence[str], slot: int | None = None) -> list[str]:
    """The row keys of ``lock_key``'s ``modes`` (of one lease slot, if given)."""
    return [kinds.kind(mode).row_key(lock_key, slot or 1) for mode in modes]


def forced_release(
    table_parts: tuple[str, ...],
    lock_key: str,
    modes: Sequence[str],
    *,
    slot: int | None = None,
    owner: str | None = None,
) -> Exchange[list[RowState]]:
    """Force-expire the held rows of ``lock_key``'s ``modes`` (every slot of a lease
    unless ``slot`` names one; only ``owner``'s, if given), marked so that ``ls`` tells
    them from abandoned ones; the lease's waiters are woken, as by a holder's release."""
    params = {
        "keys": release_keys(lock_key, modes, slot),
        "slot_pattern": _slot_pattern(modes) if slot is None else None,
        "lock_key": lock_key,
        "owner": owner,
        "channel": WAKE_CHANNEL,
        "wake_key": wake_key(lock_key),
        "host": socket.gethostname(),
    }
    return Exchange(_release_query(table_parts), params, _read_states)


@dataclass(frozen=True)
class LockRow:
    """A row of ``listing``, as ``ls`` and ``serve`` show it."""

    key: str
    mode: str
    """A kind's name (schedule, lease), or ``pause``."""
    lock_key: str
    owner: str
    """The holder's token, without a release mark; a pause's reason."""
    expire_at: datetime
    expires_in_seconds: float
    fence: int | None
    slot: int = 1
    """Which slot of an N-holder lease the row is (1 for every other row)."""
    value: str = ""
    """The ``value`` column as stored (cut, if ``truncated``)."""
    truncated: bool = False
    """``key`` or ``value`` was cut (``dislock.cli.shown``): a release mark it ended
    with is not seen either."""

    @property
    def held(self) -> bool:
        return self.expires_in_seconds > 0 and self.mode != PAUSE

    @property
    def forced(self) -> bool:
        """Released by ``dislockctl release`` rather than by its holder."""
        return self.released_by is not None

    @property
    def released_by(self) -> str | None:
        """Who ``dislockctl release`` released it as (``ROLE on HOST``; empty when the
        mark names no one); None unless it did."""
        found = None if self.held else forced_mark_of(self.value)
        return None if found is None else found[1]

    @property
    def state(self) -> str:
        """What ``ls`` says of the row: held, released, expired, ended or paused."""
        if self.mode == PAUSE:
            return "paused"
        if self.expires_in_seconds > 0:
            return "held"
        if self.value.endswith(RELEASED_MARK) or self.forced:
            return "released"
        return "ended" if self.mode == kinds.SCHEDULE else "expired"

    def activity(self, waiting: Collection[str] = ()) -> str | None:
        """``RUNNING``, ``SLOT_TAKEN`` or ``WAITING`` (a lease row among ``waiting``, by
        key: ``waiting_for_group``) for a held schedule or lease row; None otherwise."""
        if not self.held or self.mode not in (kinds.SCHEDULE, kinds.LEASE):
            return None
        if self.mode == kinds.SCHEDULE:
            return SLOT_TAKEN
        return WAITING if self.key in waiting else RUNNING

    @classmethod
    def from_row(cls, row: ListedRow) -> LockRow:
        truncated = was_cut(row.key) or was_cut(row.value)
        key, value = cut(row.key), cut(row.value)
        found, lock_key, slot = kinds.parse_row_key(key)
        mode = "?" if found is None else found.name
        if found is None and key.startswith(pause_key("")):
            mode, lock_key = PAUSE, key.removeprefix(pause_key(""))
        left = float(row.expires_in_seconds)
        forced = None if left > 0 else forced_mark_of(value)
        owner = value if left > 0 else forced[0] if forced else value.removesuffix(RELEASED_MARK)
        return cls(
            key, mode, lock_key, owner, row.expire_at, left, row.fence, slot, value, truncated
        )

    @property
    def holder_gone(self) -> int | None:
        """The pid of a held lease row's holder when the token names this host and no process
        of that pid runs here (its wrapper was killed: the row stays until its TTL); None
        otherwise.  Only a lease row says its holder is still there."""
        from dislock.core.processes import gone_here

        return gone_here(self.owner) if self.held and self.mode == kinds.LEASE else None

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(expire_at=iso(self.expire_at), held=self.held, state=self.state)
        data.update(forced=self.forced, holder_gone_pid=self.holder_gone)
        data.update(released_by=self.released_by)
        if self.mode == PAUSE:
            data["reason"] = data.pop("owner")
        return data


class Retired(NamedTuple):
    """What ``retiring`` answers: the rows it deleted, or the live row that stopped it."""

    deleted: int
    live: str | None


def retiring(table_parts: tuple[str, ...], lock_key: str) -> Exchange[Retired]:
    """Delete every row of ``lock_key`` (every kind's, every slot's, its pause), unless
    one of its leases is live: a running job's lease is not taken from under it (nor
    one taken meanwhile: the delete checks each row again).  A live schedule row is a
    slot claimed, which says nothing of a run still going."""
    modes = tuple(kinds.BY_MODE)
    query = sql.SQL(
        "WITH mine AS (SELECT key, expire_at > NOW() AND NOT key LIKE ANY (%(open)s) AS live"
        " FROM {table} WHERE key = ANY(%(keys)s) OR (key ~ %(slot_pattern)s"
        " AND regexp_replace(key, %(slot_pattern)s, '') = %(lock_key)s)),"
        " gone AS (DELETE FROM {table} AS t USING mine WHERE t.key = mine.key"
        " AND (t.expire_at <= NOW() OR t.key LIKE ANY (%(open)s))"
        " AND NOT EXISTS (SELECT FROM mine AS m WHERE m.live) RETURNING t.key)"
        " SELECT (SELECT count(*) FROM gone) AS deleted,"
        " (SELECT {live} FROM mine WHERE mine.live LIMIT 1) AS live"
    ).format(table=sql.Identifier(*table_parts), live=read("key"))
    params = {
        "keys": [*(kinds.BY_MODE[mode].row_key(lock_key) for mode in modes), pause_key(lock_key)],
        "slot_pattern": _slot_pattern(modes),
        "lock_key": lock_key,
        "open": [pause_key("") + "%", kinds.kind(kinds.SCHEDULE).row_key("") + "%"],
    }
    return Exchange(query, params, lambda rows: Retired(int(rows[0][0]), rows[0][1]))


def waiting_for_group(rows: Iterable[LockRow], unstarted: Callable[[LockRow], bool]) -> set[str]:
    """The keys of the held lease rows among ``rows`` whose run waits for a slot of its
    group: taken after the lease, before the run starts and is recorded
    (``dislock.core.groups``), so one whose owner holds no group slot listed and whose
    start its key's history does not show (``unstarted``: False when unknown)."""
    rows = list(rows)
    grouped = {row.owner for row in rows if row.mode == kinds.GROUP.name and row.held}
    return {
        row.key
        for row in rows
        if row.mode == kinds.LEASE and row.held and row.owner not in grouped and unstarted(row)
    }
