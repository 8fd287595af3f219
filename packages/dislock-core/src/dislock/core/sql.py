"""The SQL dislock runs, composed with quoted identifiers, and the lock row keys.

Every lock operation is a single statement in its own (autocommit) transaction,
so ``NOW()`` is the time that statement started.  Acquisition is one atomic
upsert: it inserts a missing row, or takes over a row whose ``expire_at`` has
passed, and touches nothing otherwise; no SELECT comes first.  Its ``WITH``
clause, the lock delay after a failover (``dislock.core.failover``), rides
along in the same statement.

Renewals only change ``expire_at``, a column no index covers, so PostgreSQL can
update the row in place (a HOT update) instead of growing the table and index.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

from psycopg import sql

from dislock.core.failover import TIMELINE, delay_end_returned, lock_delay, timeline_returned
from dislock.core.kinds import KEY_PREFIX as KEY_PREFIX
from dislock.core.kinds import LEASE, SCHEDULE, kind
from dislock.core.limits import max_ttl_of
from dislock.core.waiting import WAKE_CHANNEL, wake_key, wake_payload

if TYPE_CHECKING:
    from dislock.core.context import LockContext
    from dislock.core.cron import SlotCandidates


def schedule_key(lock_key: str) -> str:
    return kind(SCHEDULE).row_key(lock_key)


def lease_key(lock_key: str) -> str:
    return kind(LEASE).row_key(lock_key)


def pause_key(lock_key: str) -> str:
    """The row that pauses ``lock_key`` fleet-wide: ``value`` holds the reason and
    ``expire_at`` the end of the pause (``dislockctl pause``)."""
    return f"{KEY_PREFIX}:pause:{lock_key}"


def pause_key_of(row_key: str) -> str:
    """The pause row of a schedule or lease row's key."""
    prefix, _, rest = row_key.partition(":")
    _, _, lock_key = rest.partition(":")
    return pause_key(lock_key) if prefix == KEY_PREFIX else f"{KEY_PREFIX}:pause:{row_key}"


RELEASED_MARK = " (released)"
"""Appended to ``value`` by a clean release, in the same update that ends the row.

A released row and one whose holder stopped renewing both have ``expire_at`` in
the past; only this tells them apart.  The three columns stay as 0.1.0 made them
(a 0.1.0 acquisition takes the row over by ``expire_at <= NOW()`` alone), and
``expire_at`` keeps the moment of the release.  (``'-infinity'`` would have
marked it too, but psycopg cannot load it into a datetime: every reader of the
row, 0.1.0's tools included, would fail on it.)"""

FORCED_MARK = " (released by dislockctl)"
"""Appended by ``dislockctl release`` instead of ``RELEASED_MARK``."""


class Acquired(NamedTuple):
    """The answer of an acquiring statement (always exactly one row)."""

    acquired: bool
    token: int | None
    """The fencing token (None without fencing)."""
    paused_for: str | None
    """The reason of a live pause of the lock key; set only when one refused the start."""
    paused_until: datetime | None
    slot_end: datetime | None = None
    """The slot end ``acquire_by_clock`` picked by the database clock (None there when
    the clock was outside its candidates; always None for the other statements)."""
    delayed_until: datetime | None = None
    """The end of the lock delay after a failover that kept the statement from taking
    anything (``dislock.core.failover``); None when no delay runs."""
    timeline: int | None = None
    """The server's timeline the statement ran on (None from statements that do not say)."""
    ttl_cap: float | None = None
    """The table's maximum lease TTL when the lease asked for more (and so took
    nothing, ``dislock.core.limits``); None otherwise."""


def parse_acquired(row: Sequence[Any]) -> Acquired:
    """The answer of ``acquire_until`` and ``acquire_for``."""
    acquired, token, paused_for, paused_until, timeline, delayed_until, ttl_cap = row
    return Acquired(
        bool(acquired),
        token,
        paused_for,
        paused_until,
        delayed_until=delayed_until,
        timeline=timeline,
        ttl_cap=ttl_cap,
    )


def parse_by_clock(row: Sequence[Any]) -> Acquired:
    """The answer of ``acquire_by_clock``: ``parse_acquired``'s, the slot's end last."""
    acquired, token, paused_for, paused_until, timeline, delayed_until, slot_end = row
    return Acquired(
        bool(acquired),
        token,
        paused_for,
        paused_until,
        slot_end,
        delayed_until,
        timeline=timeline,
    )


class SlotAnswer(NamedTuple):
    """The answer of ``acquire_slot``."""

    key: str | None
    """The slot row taken; None if none was."""
    token: int | None
    free: int
    """How many slots looked free (to tell a full lease from a lost race)."""
    paused_for: str | None
    paused_until: datetime | None
    delayed_until: datetime | None
    ttl_cap: float | None


def parse_slot(row: Sequence[Any]) -> SlotAnswer:
    key, token, free, paused_for, paused_until, delayed_until, ttl_cap = row
    return SlotAnswer(
        None if key is None else str(key),
        token,
        int(free),
        paused_for,
        paused_until,
        delayed_until,
        ttl_cap,
    )


class Statements(NamedTuple):
    """The statements for one lock table."""

    acquire_until: sql.Composed
    """Params: key, pause, owner, expire_at (timestamptz). Returns one row, an
    ``Acquired``: whether it took the row, the fencing token (NULL without
    fencing), the reason and end of a live pause row that refused it, the
    server's timeline, and the end of a running lock delay after a failover (during
    which it takes nothing; see ``dislock.core.failover``)."""
    acquire_for: sql.Composed
    """Params: key, pause, owner, ttl (seconds). Returns like ``acquire_until``; a TTL
    over the table's maximum (``dislock.core.limits``) takes nothing and returns the
    maximum last (``parse_acquired``)."""
    renew_batch: sql.Composed
    """Params: keys, owners, ttls (parallel arrays). Renews each listed lease that is
    still ours and returns its ``(key, value)``; a lease missing from the answer is lost."""
    release: sql.Composed
    """Params: ``release_params``. Expires our row now, marked released
    (``RELEASED_MARK``), and wakes the lease's waiters (``NOTIFY`` on commit,
    ``dislock.core.waiting.wake_payload``) when it released something; a row another
    owner took is untouched."""
    hand_back: sql.Composed
    """Params: ``hand_back_params``. ``release`` for each of our rows among the keys:
    whichever slot of an N-holder lease an interrupted or unconfirmed acquisition
    may have taken.  (Not the holder's release too: matching an array costs that
    hot path about 0.05 ms.)"""
    now: sql.SQL
    """The database clock (statement time)."""
    acquire_slot: sql.Composed
    """Params: keys (the slots' row keys, slot 1 first), pause, owner, ttl. Takes the
    first free slot, in the same upsert as ``acquire_for``. Returns one row: the key
    taken (NULL if none), the fencing token, how many slots it found free (to tell a
    full lease from a slot another holder took in the same instant), the reason
    and end of a live pause that refused it, and the end of a running lock delay."""
    mine: sql.Composed
    """Params: keys, owner. The owner's live rows among the keys: ``(key, token,
    expire_at, timeline)`` each (``dislock.core.unknown_outcome``), for an
    acquisition whose answer was lost."""
    acquire_by_clock: sql.Composed
    """Params: ``acquire_by_clock_params`` (key, pause, owner and the candidates of
    ``dislock.core.cron.SlotCandidates``). ``acquire_until`` for the schedule slot
    that ``NOW()`` picks among the candidates, in one statement. Returns one row: an
    ``Acquired``, then the slot's end, NULL when ``NOW()`` was outside the
    candidates (then nothing was taken: read the clock, use ``acquire_until``)."""


NO_CAP = sql.SQL("NULL::float8")
"""The ``ttl_cap`` column of a statement that takes no lease."""

WITHIN_CAP = "%(ttl)s::float8 <= (SELECT max_ttl FROM dislock_cap)"
"""A lease acquisition's condition: its TTL is within the table's maximum."""


@lru_cache(maxsize=64)
def statements(table_parts: tuple[str, ...], fencing: bool = False) -> Statements:
    """The statements for ``table_parts``; with ``fencing``, acquisitions also bump and
    return the row's ``fence`` column, in the same statement."""
    table = sql.Identifier(*table_parts)
    if fencing:
        # A fresh row starts at 1; a taken-over row continues from its last token,
        # so tokens only grow, across releases, expiries and forced releases.
        columns = sql.SQL(", fence")
        first_token = sql.SQL(", 1")
        bump = sql.SQL(", fence = held.fence + 1")
        token = sql.SQL("held.fence")
    else:
        columns = first_token = bump = sql.SQL("")
        token = sql.SQL("NULL::bigint")
    # A live pause row of the lock key (``dislockctl pause``) keeps the row
    # source empty (every row source below says ``NOT EXISTS (SELECT FROM
    # pause)``), so nothing is inserted or taken over; its reason comes back in
    # the same answer, which is always one row.  A pause costs no round trip.
    pause = sql.SQL(
        "pause AS (SELECT value, expire_at FROM {table}"
        " WHERE key = %(pause)s AND expire_at > NOW())"
    ).format(table=table)

    def releasing(rows: sql.SQL) -> sql.Composed:
        return sql.SQL(
            "UPDATE {table} SET expire_at = NOW(), value = value || {mark}"
            " WHERE {rows} AND value = %(owner)s AND expire_at > NOW()"
            " RETURNING pg_notify(%(channel)s, {wake})"
        ).format(
            table=table,
            rows=rows,
            mark=sql.Literal(RELEASED_MARK),
            wake=wake_payload(sql.SQL("tableoid")),
        )

    # A row that is visibly live refuses the acquisition before the upsert tries
    # it: the upsert's conflict would lock the row (and so write WAL and make the
    # refusal a durable commit, ~96 bytes each) only to find it live.  A row that
    # turns live meanwhile is still refused by the upsert's own condition.
    free = sql.SQL(
        "NOT EXISTS (SELECT FROM {table} AS live WHERE live.key = %(key)s"
        " AND live.expire_at > NOW())"
    ).format(table=table)
    upsert = sql.SQL(
        "{delay}INSERT INTO {table} AS held (key, value, expire_at{columns})"
        " {row}"
        " ON CONFLICT (key) DO UPDATE"
        " SET value = EXCLUDED.value, expire_at = EXCLUDED.expire_at{bump}"
        " WHERE held.expire_at <= NOW()"
        " RETURNING {token}, {timeline}"
    )
    answer = sql.SQL(
        "WITH {delay}{pause}, taken (token, timeline) AS ({upsert})"
        " SELECT EXISTS (SELECT FROM taken), (SELECT token FROM taken),"
        " pause.value, pause.expire_at, (SELECT timeline FROM dislock_server), {delay_end},"
        " {ttl_cap} FROM (VALUES (1)) AS answer LEFT JOIN pause ON true"
    )
    # ``_acquire_slot`` formats this same upsert: a placeholder added to it must be
    # given there too (through ``parts``, ideally), so that slots keep every check.
    parts: dict[str, sql.Composable] = {"table": table, "columns": columns, "bump": bump}
    lease_expiry = sql.SQL("NOW() + make_interval(secs => %(ttl)s)")
    # After a failover, no one takes a missing or expired row for a while (see
    # dislock.core.failover); the fragment also returns the server's timeline.
    slot_ctes, slot_calm = lock_delay(table, sql.SQL("0"))
    lease_ctes, lease_calm = lock_delay(table, sql.SQL("%(ttl)s"))
    # Its common table expressions go first: PostgreSQL allows data-modifying
    # ones only at the top of a statement.
    slot_delay = sql.SQL("{}, ").format(slot_ctes)
    lease_delay = sql.SQL("{}, ").format(lease_ctes)
    parts["timeline"] = timeline_returned()
    slot_end = sql.SQL("%(expire_at)s::timestamptz")
    # A lease longer than the table allows takes nothing and says so; the
    # row-level security of ``dislock.core.grants`` refuses it too.
    ttl_refused = sql.SQL(
        "CASE WHEN NOT {within} THEN (SELECT max_ttl FROM dislock_cap) END"
    ).format(within=sql.SQL(WITHIN_CAP))

    def acquiring(
        delay: sql.Composable,
        expiry: sql.Composable,
        calm: sql.Composable,
        *,
        only: str = "",
        ttl_cap: sql.Composable = NO_CAP,
    ) -> sql.Composed:
        """The one-row answer of the upsert of a row that ends at ``expiry``, taken
        unless paused or in a lock delay (``calm``), and only if ``only`` holds."""
        row = sql.SQL(
            "SELECT %(key)s, %(owner)s, {expiry}{first_token}"
            " WHERE {only}NOT EXISTS (SELECT FROM pause) AND {free} AND {calm}"
        ).format(
            expiry=expiry,
            first_token=first_token,
            free=free,
            calm=calm,
            only=sql.SQL(only).format(expiry=expiry),
        )
        return answer.format(
            delay=delay,
            delay_end=delay_end_returned(),
            ttl_cap=ttl_cap,
            pause=pause,
            upsert=upsert.format(row=row, token=token, delay=sql.SQL(""), **parts),
        )

    return Statements(
        # A slot that ended between computing it and claiming it (a slow start
        # straddling a boundary, or a next_run_time in the past) is not claimed:
        # it would be free at once and let a second start into the new slot.
        acquire_until=acquiring(slot_delay, slot_end, slot_calm, only="{expiry} > NOW() AND "),
        acquire_for=acquiring(
            lease_delay,
            lease_expiry,
            sql.SQL("{} AND {}").format(lease_calm, sql.SQL(WITHIN_CAP)),
            ttl_cap=ttl_refused,
        ),
        # Every lease a process holds in this table, in one statement.  The
        # arrays join on (key, value) like ``WHERE (key, value) IN (...)`` would,
        # and carry each lease's own TTL along.  A row whose TTL already ran out
        # is not renewed, even if nobody took it.
        renew_batch=sql.SQL(
            "UPDATE {table} AS held"
            " SET expire_at = NOW() + make_interval(secs => batch.ttl)"
            " FROM unnest(%(keys)s::text[], %(owners)s::text[], %(ttls)s::float8[])"
            " AS batch (key, value, ttl)"
            " WHERE held.key = batch.key AND held.value = batch.value"
            " AND held.expire_at > NOW()"
            # A lease longer than the table's maximum (lowered while it ran) is not
            # renewed, so it alone is lost, rather than failing the whole batch
            # under row-level security (dislock.core.grants).
            " AND batch.ttl <= {cap}"
            " RETURNING held.key, held.value"
        ).format(table=table, cap=max_ttl_of(table)),
        release=releasing(sql.SQL("key = %(key)s")),
        hand_back=releasing(sql.SQL("key = ANY(%(keys)s::text[])")),
        now=sql.SQL("SELECT NOW()"),
        mine=sql.SQL(
            "SELECT key, {token}, expire_at, {timeline} FROM {table} AS held"
            " WHERE key = ANY(%(keys)s::text[]) AND value = %(owner)s AND expire_at > NOW()"
            " ORDER BY key"
        ).format(token=token, timeline=TIMELINE, table=table),
        acquire_slot=_acquire_slot(
            upsert, pause, parts, table, first_token, token, lease_expiry, (lease_ctes, lease_calm)
        ),
        acquire_by_clock=_acquire_by_clock(
            upsert, pause, parts, first_token, token, (slot_ctes, slot_calm), free
        ),
    )


def _acquire_by_clock(
    upsert: sql.SQL,
    pause: sql.Composable,
    parts: dict[str, sql.Composable],
    first_token: sql.Composable,
    token: sql.Composable,
    delay: tuple[sql.Composable, sql.Composable],
    free: sql.Composable,
) -> sql.Composed:
    """``acquire_until``'s upsert, its slot end picked by ``NOW()`` from scalar
    candidates with a CASE (no arrays: a new server session, which every cron run
    has, plans it fastest); the round trip that reads the clock is saved.  It
    answers like ``acquire_until`` (the timeline fifth, the lock delay's end sixth),
    then the slot end it picked (NULL when the database clock is outside the candidates)."""
    from dislock.core.cron import SlotCandidates

    ctes, calm = delay
    choices = sql.SQL("").join(
        sql.SQL(" WHEN NOW() <= {latest}::timestamptz THEN {end}::timestamptz").format(
            latest=sql.Placeholder(f"latest_{i}"), end=sql.Placeholder(f"end_{i}")
        )
        for i in range(SlotCandidates.COUNT)
    )
    taking = upsert.format(
        row=sql.SQL(
            "SELECT %(key)s, %(owner)s, slot.slot_end{first_token} FROM slot"
            " WHERE slot.slot_end IS NOT NULL AND NOT EXISTS (SELECT FROM pause) AND {free}"
            " AND {calm}"
        ).format(first_token=first_token, free=free, calm=calm),
        token=token,
        delay=sql.SQL(""),
        **parts,
    )
    return sql.SQL(
        "WITH {ctes}, {pause},"
        " slot AS (SELECT CASE WHEN NOW() < %(covered_from)s::timestamptz THEN NULL{choices}"
        " END AS slot_end),"
        " taken (token, timeline) AS ({taking})"
        " SELECT EXISTS (SELECT FROM taken), (SELECT token FROM taken),"
        " pause.value, pause.expire_at, {timeline}, {delay_end}, slot.slot_end"
        " FROM slot LEFT JOIN pause ON true"
    ).format(
        ctes=ctes,
        pause=pause,
        choices=choices,
        taking=taking,
        timeline=parts["timeline"],
        delay_end=delay_end_returned(),
    )


def _acquire_slot(
    upsert: sql.SQL,
    pause: sql.Composable,
    parts: dict[str, sql.Composable],
    table: sql.Identifier,
    first_token: sql.Composable,
    token: sql.Composable,
    expiry: sql.Composable,
    delay: tuple[sql.Composable, sql.Composable],
) -> sql.Composed:
    """``acquire_for`` over the first of several rows that is free, in one statement.

    It is the same upsert (anything added to it for every acquisition applies to
    slots too), fed the lowest-numbered slot that looks free.  Two holders picking
    the same slot at once cannot both get it: the upsert's own condition decides,
    and the loser learns from ``free`` that another slot may be left.  The lock
    delay's common table expressions go to the top (PostgreSQL allows
    data-modifying ones only there), and during a delay no slot counts as free.
    """
    ctes, calm = delay
    taking = upsert.format(
        row=sql.SQL(
            "SELECT free.key, %(owner)s, {expiry}{first_token} FROM free"
            " WHERE NOT EXISTS (SELECT FROM pause) AND {within} ORDER BY free.n LIMIT 1"
        ).format(expiry=expiry, first_token=first_token, within=sql.SQL(WITHIN_CAP)),
        token=sql.SQL("held.key, {token}").format(token=token),
        delay=sql.SQL(""),
        **parts,
    )
    # Answers: the key taken (NULL if none), the token, how many slots looked
    # free, the reason and end of a live pause (which took nothing), and the end of
    # a lock delay (which took nothing either).
    return sql.SQL(
        "WITH {ctes}, {pause}, free AS ("
        " SELECT slot.key, slot.n FROM unnest(%(keys)s::text[]) WITH ORDINALITY AS slot (key, n)"
        " WHERE NOT EXISTS (SELECT FROM {table} AS held"
        " WHERE held.key = slot.key AND held.expire_at > NOW()) AND {calm}),"
        " taken (key, token, timeline) AS ({taking})"
        " SELECT taken.key, taken.token, (SELECT count(*) FROM free), pause.value, pause.expire_at,"
        " {delay_end}, CASE WHEN NOT {within} THEN (SELECT max_ttl FROM dislock_cap) END"
        " FROM (SELECT) AS one LEFT JOIN taken ON true LEFT JOIN pause ON true"
    ).format(
        ctes=ctes,
        pause=pause,
        table=table,
        taking=taking,
        calm=calm,
        delay_end=delay_end_returned(),
        within=sql.SQL(WITHIN_CAP),
    )


def statements_for(context: LockContext) -> Statements:
    return statements(tuple(context.table_parts), context.fencing)


def acquire_until_params(key: str, owner: str, expire_at: datetime) -> dict[str, Any]:
    return {"key": key, "pause": pause_key_of(key), "owner": owner, "expire_at": expire_at}


def acquire_by_clock_params(key: str, owner: str, candidates: SlotCandidates) -> dict[str, Any]:
    """Parameters of ``acquire_by_clock``."""
    params: dict[str, Any] = {
        "key": key,
        "pause": pause_key_of(key),
        "owner": owner,
        "covered_from": candidates.covered_from,
    }
    for i, (end, latest) in enumerate(zip(candidates.ends, candidates.latest_starts, strict=True)):
        params[f"end_{i}"] = end
        params[f"latest_{i}"] = latest
    return params


def lease_params(key: str, owner: str, ttl_seconds: float) -> dict[str, Any]:
    """Parameters of ``acquire_for``."""
    return {"key": key, "pause": pause_key_of(key), "owner": owner, "ttl": ttl_seconds}


def release_params(key: str, owner: str, lock_key: str) -> dict[str, Any]:
    """Parameters of ``release``: our row ``key`` of the lock ``lock_key`` (whose
    lease's waiters are woken)."""
    return {"key": key, "owner": owner, "channel": WAKE_CHANNEL, "wake_key": wake_key(lock_key)}


def hand_back_params(keys: list[str], owner: str, lock_key: str) -> dict[str, Any]:
    """Parameters of ``hand_back``: our rows among ``keys``, of the lock ``lock_key``."""
    return {"keys": keys, "owner": owner, "channel": WAKE_CHANNEL, "wake_key": wake_key(lock_key)}


def mine_params(keys: list[str], owner: str) -> dict[str, Any]:
    """Parameters of ``mine``."""
    return {"keys": keys, "owner": owner}


def slot_params(keys: list[str], owner: str, ttl_seconds: float) -> dict[str, Any]:
    """Parameters of ``acquire_slot`` (``keys[0]`` is the plain lease row)."""
    return {"keys": keys, "pause": pause_key_of(keys[0]), "owner": owner, "ttl": ttl_seconds}


def create_table(table_parts: tuple[str, ...], *, fencing: bool = False) -> sql.Composed:
    """The lock table, created if missing.

    ``fillfactor`` leaves room in each page so that renewals, which only touch
    the unindexed ``expire_at``, stay in-place (HOT) updates.
    """
    fence = sql.SQL(", fence bigint NOT NULL DEFAULT 0") if fencing else sql.SQL("")
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {table} ("
        "key text PRIMARY KEY, value text NOT NULL, expire_at timestamptz NOT NULL{fence})"
        " WITH (fillfactor = 70)"
    ).format(table=sql.Identifier(*table_parts), fence=fence)


def create_table_sql(table_parts: tuple[str, ...], *, fencing: bool = False) -> str:
    """The DDL as plain text, for messages and for teams that apply DDL by hand."""
    return create_table(table_parts, fencing=fencing).as_string(None) + ";"
