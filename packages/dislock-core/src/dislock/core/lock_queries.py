"""The text of the lock statements, composed from named fragments with quoted identifiers.

Every lock operation is a single statement in its own (autocommit) transaction,
so ``NOW()`` is the time that statement started.  Acquisition is one atomic
upsert: it inserts a missing row, or takes over a row whose ``expire_at`` has
passed, and touches nothing otherwise; no SELECT comes first.  Its ``WITH``
clause, the lock delay after a failover (``dislock.core.failover``), rides
along in the same statement, and so do a pause's refusal and the table's TTL cap.

Renewals only change ``expire_at``, a column no index covers, so PostgreSQL can
update the row in place (a HOT update) instead of growing the table and index.

``dislock.core.lock_statements`` pairs each text with its parameters and the
reader of its answer (``dislock.core.answers``); the columns each answers are
listed here, where they are written.
"""

from __future__ import annotations

from typing import NamedTuple

from psycopg import sql

from dislock.core import retries
from dislock.core.answers import (
    ClaimRow,
    ClockClaimRow,
    LookRow,
    Renewed,
    RetryingClaimRow,
    SlotClaimRow,
)
from dislock.core.exchange import select_list
from dislock.core.failover import (
    TIMELINE,
    TIMELINE_KEY,
    TTL_RECORD,
    delay_end_returned,
    lock_delay,
    timeline_returned,
)
from dislock.core.limits import MAX_TTL_KEY, max_ttl_of
from dislock.core.rows import RELEASED_MARK, lock_key_of_pause
from dislock.core.unknown_outcome import Mine
from dislock.core.waiting import wake_payload


class Queries(NamedTuple):
    """The text of the lock statements of one table (``LockStatements`` gives each its
    parameters and its reader)."""

    acquire_until: sql.Composed
    """Params: key, pause, owner, expire_at (timestamptz).  Takes the row until
    ``expire_at``.  One row, ``dislock.core.answers.ClaimRow``: whether it took the
    row, the fencing token (NULL without fencing), the reason and end of a live pause
    that refused it, the server's timeline, the end of a running lock delay after a
    failover (during which it takes nothing), and NULL (no TTL cap applies)."""
    acquire_for: sql.Composed
    """Params: key, pause, owner, ttl (seconds).  Answers like ``acquire_until``, the
    last column the table's maximum TTL when ``ttl`` is over it (then it took
    nothing; ``dislock.core.limits``)."""
    renew_batch: sql.Composed
    """Params: keys, owners, ttls (parallel arrays).  Renews each listed lease that is
    still ours; a row ``(key, value)`` per lease renewed, a lease missing is lost."""
    release: sql.Composed
    """Params: key, owner, channel, wake_key.  Expires our row now, marked released
    (``RELEASED_MARK``), and wakes the lease's waiters (``NOTIFY`` on commit,
    ``dislock.core.waiting.wake_payload``); a row per row ended, none if another
    owner had taken it."""
    hand_back: sql.Composed
    """Params: keys, owner, channel, wake_key.  ``release`` for each of our rows among
    the keys: whichever slot of an N-holder lease an interrupted or unconfirmed
    acquisition may have taken.  (Not the holder's release too: matching an array
    costs that hot path about 0.05 ms.)"""
    now: sql.SQL
    """The database clock (statement time), one row of one column."""
    acquire_slot: sql.Composed
    """Params: keys (the slots' row keys, slot 1 first), pause, owner, ttl.  Takes the
    first free slot, in the same upsert as ``acquire_for``.  One row
    (``dislock.core.answers.SlotClaimRow``): the key taken
    (NULL if none), the fencing token, how many slots it found free (to tell a
    full lease from a slot another holder took in the same instant), the reason
    and end of a live pause that refused it, the end of a running lock delay, and
    the TTL cap as ``acquire_for`` gives it."""
    mine: sql.Composed
    """Params: keys, owner.  The owner's live rows among the keys, ``(key, token,
    expire_at, timeline)`` each (``dislock.core.unknown_outcome``), for an
    acquisition whose answer was lost."""
    acquire_by_clock: sql.Composed
    """Params: key, pause, owner, covered_from and ``end_<i>``/``latest_<i>`` for each
    candidate of ``dislock.core.cron.SlotCandidates``.  ``acquire_until`` for the
    schedule slot that ``NOW()`` picks among the candidates, in one statement.
    Answers ``ClockClaimRow``: ``acquire_until``'s, but its last column is the slot's end, NULL when
    ``NOW()`` was outside the candidates (then nothing was taken: read the clock,
    use ``acquire_until``)."""
    acquire_retrying: sql.Composed
    """Params: key, pause, owner, expire_at, and ``dislock.core.retries.claim_params``.
    ``acquire_until`` for a job with retries: it takes the slot's row as its next
    attempt when an earlier attempt failed and reopened it, or vanished
    (``dislock.core.retries``).  Answers ``RetryingClaimRow``: ``acquire_until``'s, then the attempt
    it took or would have taken (NULL: none may start now) and, when a failed
    attempt reopened the slot for later, the moment the next may start."""
    reopen: sql.Composed
    """``dislock.core.retries.reopen_query``."""
    done: sql.Composed
    """``dislock.core.retries.done_query``."""
    look: sql.Composed
    """Params: key, pause.  A read sent before the acquiring statement on a new
    connection (``dislock.core.answers.look_reader``): ``(NOW(), clock_timestamp(),
    the server's timeline, key, value, expire_at)`` of whichever of the key's row,
    its pause row, the failover timeline row and the maximum-TTL row exist, by
    primary key.  A new backend plans the acquiring statement for several times the
    server CPU this read costs (and, behind a pooler, every backend plans it anew),
    and when a fleet's crontabs fire together every machine but one is refused."""
    take_over: sql.Composed
    """Params: key, pause, owner, successor, ttl.  Takes the live lease row ``key``
    that a replaced holder handed over (its value ``successor``, ``dislock.core.replace_marks``)
    for ``ttl`` seconds, unless paused or over the TTL cap.  Answers like
    ``acquire_for``."""


NO_CAP = sql.SQL("NULL::float8")
"""The ``ttl_cap`` column of a statement that takes no lease."""

WITHIN_CAP = "%(ttl)s::float8 <= (SELECT max_ttl FROM dislock_cap)"
"""A lease acquisition's condition: its TTL is within the table's maximum."""


def queries(
    table_parts: tuple[str, ...], fencing: bool = False, record: sql.Composable = TTL_RECORD
) -> Queries:
    """The statements' text for ``table_parts``; with ``fencing``, acquisitions also bump and
    return the row's ``fence`` column, in the same statement.  ``record``: the key of
    the acquiring role's longest-TTL record (``dislock.core.failover``)."""
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
        " WHERE {claimable}"
        " RETURNING {token}, {timeline}"
    )

    def answer(
        delay: sql.Composable, upsert: sql.Composable, ttl_cap: sql.Composable
    ) -> sql.Composed:
        """The one row of an acquisition's answer (``ClaimRow``), around its upsert."""
        return sql.SQL(
            "WITH {delay}{pause}, taken (token, timeline) AS ({upsert})"
            " SELECT {columns} FROM (VALUES (1)) AS answer LEFT JOIN pause ON true"
        ).format(
            delay=delay,
            pause=pause,
            upsert=upsert,
            columns=_claim_columns(
                ClaimRow._fields,
                sql.SQL("(SELECT timeline FROM dislock_server)"),
                ttl_cap=ttl_cap,
            ),
        )

    # ``_acquire_slot`` formats this same upsert: a placeholder added to it must be
    # given there too (through ``parts``, ideally), so that slots keep every check.
    parts: dict[str, sql.Composable] = {
        "table": table,
        "columns": columns,
        "bump": bump,
        "claimable": sql.SQL("held.expire_at <= NOW()"),
    }
    lease_expiry = sql.SQL("NOW() + make_interval(secs => %(ttl)s)")
    # After a failover, no one takes a missing or expired row for a while (see
    # dislock.core.failover); the fragment also returns the server's timeline.
    lock_key = lock_key_of_pause(sql.SQL("%(pause)s"))
    slot_ctes, slot_calm = lock_delay(table, sql.SQL("0"), lock_key, record)
    lease_ctes, lease_calm = lock_delay(table, sql.SQL("%(ttl)s"), lock_key, record)
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
        return answer(
            delay, upsert.format(row=row, token=token, delay=sql.SQL(""), **parts), ttl_cap
        )

    return Queries(
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
            " RETURNING {columns}"
        ).format(
            table=table,
            cap=max_ttl_of(table),
            columns=select_list(
                Renewed._fields, key=sql.SQL("held.key"), owner=sql.SQL("held.value")
            ),
        ),
        release=releasing(sql.SQL("key = %(key)s")),
        hand_back=releasing(sql.SQL("key = ANY(%(keys)s::text[])")),
        now=sql.SQL("SELECT NOW()"),
        mine=sql.SQL(
            "SELECT {columns} FROM {table} AS held"
            " WHERE key = ANY(%(keys)s::text[]) AND value = %(owner)s AND expire_at > NOW()"
            " ORDER BY key"
        ).format(
            columns=select_list(
                Mine._fields,
                key=sql.SQL("key"),
                token=token,
                expire_at=sql.SQL("expire_at"),
                timeline=TIMELINE,
            ),
            table=table,
        ),
        acquire_slot=_acquire_slot(
            upsert, pause, parts, table, first_token, token, lease_expiry, (lease_ctes, lease_calm)
        ),
        acquire_by_clock=_acquire_by_clock(
            upsert, pause, parts, first_token, token, (slot_ctes, slot_calm), free
        ),
        acquire_retrying=_acquire_retrying(
            upsert, pause, parts, first_token, token, (slot_ctes, slot_calm)
        ),
        reopen=retries.reopen_query(table),
        done=retries.done_query(table),
        take_over=answer(
            lease_delay,
            sql.SQL(
                "UPDATE {table} AS held SET value = %(owner)s, expire_at = {expiry}{bump}"
                " WHERE held.key = %(key)s AND held.value = %(successor)s"
                " AND held.expire_at > NOW() AND NOT EXISTS (SELECT FROM pause) AND {within}"
                " RETURNING {token}, {timeline}"
            ).format(
                table=table,
                expiry=lease_expiry,
                bump=bump,
                within=sql.SQL(WITHIN_CAP),
                token=token,
                timeline=parts["timeline"],
            ),
            ttl_refused,
        ),
        look=sql.SQL(
            "SELECT {columns} FROM {table}"
            " WHERE key IN (%(key)s, %(pause)s, {timeline_key}, {max_ttl_key})"
        ).format(
            table=table,
            columns=select_list(
                LookRow._fields,
                now=sql.SQL("NOW()"),
                clock=sql.SQL("clock_timestamp()"),
                timeline=TIMELINE,
                key=sql.SQL("key"),
                value=sql.SQL("value"),
                expire_at=sql.SQL("expire_at"),
            ),
            timeline_key=sql.Literal(TIMELINE_KEY),
            max_ttl_key=sql.Literal(MAX_TTL_KEY),
        ),
    )


def _claim_columns(
    fields: tuple[str, ...], timeline: sql.Composable, **last: sql.Composable
) -> sql.Composed:
    """The columns every claim answers (``ClaimRow``'s first six: whether it took the
    row, its token, a pause that refused it, the timeline, a lock delay's end), then
    ``last``, named by the reader's row type's ``fields``."""
    return select_list(
        fields,
        acquired=sql.SQL("EXISTS (SELECT FROM taken)"),
        token=sql.SQL("(SELECT token FROM taken)"),
        paused_for=sql.SQL("pause.value"),
        paused_until=sql.SQL("pause.expire_at"),
        timeline=timeline,
        delayed_until=delay_end_returned(),
        **last,
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
    answers ``ClockClaimRow``: ``acquire_until``'s columns, then the slot end it picked
    (NULL when the database clock is outside the candidates)."""
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
        " SELECT {columns} FROM slot LEFT JOIN pause ON true"
    ).format(
        ctes=ctes,
        pause=pause,
        choices=choices,
        taking=taking,
        columns=_claim_columns(
            ClockClaimRow._fields, parts["timeline"], slot_end=sql.SQL("slot.slot_end")
        ),
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
    return sql.SQL(
        "WITH {ctes}, {pause}, free AS ("
        " SELECT slot.key, slot.n FROM unnest(%(keys)s::text[]) WITH ORDINALITY AS slot (key, n)"
        " WHERE NOT EXISTS (SELECT FROM {table} AS held"
        " WHERE held.key = slot.key AND held.expire_at > NOW()) AND {calm}),"
        " taken (key, token, timeline) AS ({taking})"
        " SELECT {columns}"
        " FROM (SELECT) AS one LEFT JOIN taken ON true LEFT JOIN pause ON true"
    ).format(
        ctes=ctes,
        pause=pause,
        table=table,
        taking=taking,
        calm=calm,
        columns=select_list(
            SlotClaimRow._fields,
            key=sql.SQL("taken.key"),
            token=sql.SQL("taken.token"),
            free=sql.SQL("(SELECT count(*) FROM free)"),
            paused_for=sql.SQL("pause.value"),
            paused_until=sql.SQL("pause.expire_at"),
            delayed_until=delay_end_returned(),
            ttl_cap=sql.SQL("CASE WHEN NOT {} THEN (SELECT max_ttl FROM dislock_cap) END").format(
                sql.SQL(WITHIN_CAP)
            ),
        ),
    )


def _acquire_retrying(
    upsert: sql.SQL,
    pause: sql.Composable,
    parts: dict[str, sql.Composable],
    first_token: sql.Composable,
    token: sql.Composable,
    delay: tuple[sql.Composable, sql.Composable],
) -> sql.Composed:
    """``acquire_until``'s upsert for a job with retries (``dislock.core.retries``):
    the row it writes names the attempt, and it may take a row that is still live
    when the attempt holding it vanished (its lease expired unreleased)."""
    ctes, calm = delay
    table = parts["table"]
    assert isinstance(table, sql.Identifier)
    row = sql.SQL(
        "SELECT %(key)s, %(owner)s || CASE WHEN attempt.n > 1"
        " THEN ' (attempt ' || attempt.n || ')' ELSE '' END,"
        " %(expire_at)s::timestamptz{first_token} FROM attempt"
        " WHERE %(expire_at)s::timestamptz > NOW() AND attempt.n <= %(attempts)s"
        " AND NOT EXISTS (SELECT FROM pause) AND {calm}"
    ).format(first_token=first_token, calm=calm)
    taking = upsert.format(
        row=row,
        token=token,
        delay=sql.SQL(""),
        **{**parts, "claimable": retries.claimable(table)},
    )
    return sql.SQL(
        "WITH {ctes}, {pause}, {attempt}, taken (token, timeline) AS ({taking})"
        " SELECT {columns} FROM attempt LEFT JOIN pause ON true"
    ).format(
        ctes=ctes,
        pause=pause,
        attempt=retries.next_attempt(table),
        taking=taking,
        columns=_claim_columns(
            RetryingClaimRow._fields,
            parts["timeline"],
            attempt=sql.SQL("attempt.n"),
            retry_at=sql.SQL("attempt.retry_at"),
        ),
    )
