"""The text of the acquiring statements (``dislock.core.lock_queries.Queries``' claims):
one upsert, fed a candidate row, inside a statement that answers one row.

Acquisition is one atomic upsert: it inserts a missing row, or takes over a row whose
``expire_at`` has passed, and touches nothing otherwise; no SELECT comes first.  Its
``WITH`` clause, the lock delay after a failover (``dislock.core.failover``), rides
along in the same statement, and so do a pause's refusal and the table's TTL cap.
"""

from __future__ import annotations

from psycopg import sql

from dislock.core import retries
from dislock.core.answers import ClaimRow, ClockClaimRow, RetryingClaimRow, SlotClaimRow
from dislock.core.exchange import select_list
from dislock.core.failover import delay_end_returned, lock_delay, timeline_returned
from dislock.core.limits import NEVER_EXPIRES
from dislock.core.rows import lock_key_of_pause

NO_CAP = sql.SQL("NULL::float8")
"""The ``ttl_cap`` column of a statement that takes no lease."""

WITHIN_CAP = sql.SQL("%(ttl)s::float8 <= (SELECT max_ttl FROM dislock_cap)")
"""A lease acquisition's condition: its TTL is within the table's maximum."""

# A lease longer than the table allows takes nothing and says so; the row-level
# security of ``dislock.core.grants`` refuses it too.
TTL_REFUSED = sql.SQL("CASE WHEN NOT {} THEN (SELECT max_ttl FROM dislock_cap) END").format(
    WITHIN_CAP
)

LEASE_EXPIRY = sql.SQL("NOW() + make_interval(secs => %(ttl)s)")
PAUSED_UNTIL = sql.SQL(
    "CASE WHEN pause.expire_at > {never} THEN {never} ELSE pause.expire_at END"
).format(never=sql.Literal(NEVER_EXPIRES))
"""A pause written ``'infinity'`` by hand is one until resumed: psycopg loads no infinity
(``least`` would answer a missing pause, NULL, as one)."""

_NOTHING = sql.SQL("")
_EXPIRED = sql.SQL("held.expire_at <= NOW()")


class Claims:
    """The acquiring statements of one table, built from the fragments they share
    (each method is the ``Queries`` field of its name)."""

    def __init__(self, table: sql.Identifier, fencing: bool, record: sql.Composable) -> None:
        self.table = table
        if fencing:
            # A fresh row starts at 1; a taken-over row continues from its last token,
            # so tokens only grow, across releases, expiries and forced releases.
            self.columns = sql.SQL(", fence")
            self.first_token = sql.SQL(", 1")
            self.bump = sql.SQL(", fence = held.fence + 1")
            self.token = sql.SQL("held.fence")
        else:
            self.columns = self.first_token = self.bump = sql.SQL("")
            self.token = sql.SQL("NULL::bigint")
        # A live pause row of the lock key (``dislockctl pause``) keeps the row
        # source empty (every row source below says ``NOT EXISTS (SELECT FROM
        # pause)``), so nothing is inserted or taken over; its reason comes back in
        # the same answer, which is always one row.  A pause costs no round trip.
        self.pause = sql.SQL(
            "pause AS (SELECT value, expire_at FROM {table}"
            " WHERE key = %(pause)s AND expire_at > NOW())"
        ).format(table=table)
        # A row that is visibly live refuses the acquisition before the upsert tries
        # it: the upsert's conflict would lock the row (and so write WAL and make the
        # refusal a durable commit, ~96 bytes each) only to find it live.  A row that
        # turns live meanwhile is still refused by the upsert's own condition.
        self.free = sql.SQL(
            "NOT EXISTS (SELECT FROM {table} AS live WHERE live.key = %(key)s"
            " AND live.expire_at > NOW())"
        ).format(table=table)
        # After a failover, no one takes a missing or expired row for a while (see
        # dislock.core.failover); the fragment also returns the server's timeline.
        lock_key = lock_key_of_pause(sql.SQL("%(pause)s"))
        self.slot_delay = lock_delay(table, sql.SQL("0"), lock_key, record)
        self.lease_delay = lock_delay(table, sql.SQL("%(ttl)s"), lock_key, record)

    def _upsert(
        self,
        row: sql.Composable,
        *,
        returning: sql.Composable | None = None,
        claimable: sql.Composable = _EXPIRED,
    ) -> sql.Composed:
        """The upsert every acquisition is (anything added to it applies to them all),
        fed its candidate ``row``."""
        return sql.SQL(
            "INSERT INTO {table} AS held (key, value, expire_at{columns})"
            " {row}"
            " ON CONFLICT (key) DO UPDATE"
            " SET value = EXCLUDED.value, expire_at = EXCLUDED.expire_at{bump}"
            " WHERE {claimable}"
            " RETURNING {returning}, {timeline}"
        ).format(
            table=self.table,
            columns=self.columns,
            row=row,
            bump=self.bump,
            claimable=claimable,
            returning=self.token if returning is None else returning,
            timeline=timeline_returned(),
        )

    def _answer(
        self,
        delay: tuple[sql.Composable, sql.Composable],
        taking: sql.Composable,
        columns: sql.Composable,
        *,
        more: sql.Composable = _NOTHING,
        source: str = "(VALUES (1)) AS answer",
        taken: str = "token, timeline",
    ) -> sql.Composed:
        """The one row of an acquisition's answer, around its upsert ``taking``.  The
        lock ``delay``'s common table expressions go first: PostgreSQL allows
        data-modifying ones only at the top of a statement."""
        return sql.SQL(
            "WITH {ctes}, {pause}{more}, taken ({taken}) AS ({taking})"
            " SELECT {columns} FROM {source} LEFT JOIN pause ON true"
        ).format(
            ctes=delay[0],
            pause=self.pause,
            more=more,
            taken=sql.SQL(taken),
            taking=taking,
            columns=columns,
            source=sql.SQL(source),
        )

    def _claim(
        self,
        delay: tuple[sql.Composable, sql.Composable],
        expiry: sql.Composable,
        *,
        only: sql.Composable = _NOTHING,
        within: sql.Composable | None = None,
        ttl_cap: sql.Composable = NO_CAP,
    ) -> sql.Composed:
        """The answer of the upsert of the row ``key`` until ``expiry``, taken unless
        paused or in a lock delay, and only if ``only`` (and ``within``) holds."""
        calm = delay[1] if within is None else sql.SQL("{} AND {}").format(delay[1], within)
        row = sql.SQL(
            "SELECT %(key)s, %(owner)s, {expiry}{first_token}"
            " WHERE {only}NOT EXISTS (SELECT FROM pause) AND {free} AND {calm}"
        ).format(expiry=expiry, first_token=self.first_token, only=only, free=self.free, calm=calm)
        return self._answer(
            delay, self._upsert(row), _claim_columns(ClaimRow._fields, ttl_cap=ttl_cap)
        )

    def acquire_until(self) -> sql.Composed:
        # A slot that ended between computing it and claiming it (a slow start
        # straddling a boundary, or a next_run_time in the past) is not claimed:
        # it would be free at once and let a second start into the new slot.
        end = sql.SQL("%(expire_at)s::timestamptz")
        return self._claim(self.slot_delay, end, only=sql.SQL("{} > NOW() AND ").format(end))

    def acquire_for(self) -> sql.Composed:
        return self._claim(self.lease_delay, LEASE_EXPIRY, within=WITHIN_CAP, ttl_cap=TTL_REFUSED)

    def acquire_by_clock(self) -> sql.Composed:
        """Its slot end is picked by ``NOW()`` from scalar candidates with a CASE (no
        arrays: a new server session, which every cron run has, plans it fastest)."""
        from dislock.core.cron import SlotCandidates

        choices = sql.SQL("").join(
            sql.SQL(" WHEN NOW() <= {latest}::timestamptz THEN {end}::timestamptz").format(
                latest=sql.Placeholder(f"latest_{i}"), end=sql.Placeholder(f"end_{i}")
            )
            for i in range(SlotCandidates.COUNT)
        )
        row = sql.SQL(
            "SELECT %(key)s, %(owner)s, slot.slot_end{first_token} FROM slot"
            " WHERE slot.slot_end IS NOT NULL AND NOT EXISTS (SELECT FROM pause) AND {free}"
            " AND {calm}"
        ).format(first_token=self.first_token, free=self.free, calm=self.slot_delay[1])
        return self._answer(
            self.slot_delay,
            self._upsert(row),
            _claim_columns(ClockClaimRow._fields, slot_end=sql.SQL("slot.slot_end")),
            more=sql.SQL(
                ", slot AS (SELECT CASE WHEN NOW() < %(covered_from)s::timestamptz THEN NULL"
                "{} END AS slot_end)"
            ).format(choices),
            source="slot",
        )

    def acquire_slot(self) -> sql.Composed:
        """The same upsert, fed the lowest-numbered slot that looks free.  Two holders
        picking the same slot at once cannot both get it: the upsert's own condition
        decides, and the loser learns from ``free`` that another slot may be left.
        During a lock delay no slot counts as free."""
        row = sql.SQL(
            "SELECT free.key, %(owner)s, {expiry}{first_token} FROM free"
            " WHERE NOT EXISTS (SELECT FROM pause) AND {within} ORDER BY free.n LIMIT 1"
        ).format(expiry=LEASE_EXPIRY, first_token=self.first_token, within=WITHIN_CAP)
        free = sql.SQL(
            ", free AS ( SELECT slot.key, slot.n"
            " FROM unnest(%(keys)s::text[]) WITH ORDINALITY AS slot (key, n)"
            " WHERE NOT EXISTS (SELECT FROM {table} AS held"
            " WHERE held.key = slot.key AND held.expire_at > NOW()) AND {calm})"
        ).format(table=self.table, calm=self.lease_delay[1])
        columns = select_list(
            SlotClaimRow._fields,
            key=sql.SQL("taken.key"),
            token=sql.SQL("taken.token"),
            free=sql.SQL("(SELECT count(*) FROM free)"),
            paused_for=sql.SQL("pause.value"),
            paused_until=PAUSED_UNTIL,
            delayed_until=delay_end_returned(),
            ttl_cap=TTL_REFUSED,
        )
        return self._answer(
            self.lease_delay,
            self._upsert(row, returning=sql.SQL("held.key, {}").format(self.token)),
            columns,
            more=free,
            source="(SELECT) AS one LEFT JOIN taken ON true",
            taken="key, token, timeline",
        )

    def acquire_retrying(self) -> sql.Composed:
        """The row it writes names the attempt, and it may take a row that is still
        live when the attempt holding it vanished (its lease expired unreleased)."""
        row = sql.SQL(
            "SELECT %(key)s, %(owner)s || CASE WHEN attempt.n > 1"
            " THEN ' (attempt ' || attempt.n || ')' ELSE '' END,"
            " %(expire_at)s::timestamptz{first_token} FROM attempt"
            " WHERE %(expire_at)s::timestamptz > NOW() AND attempt.n <= %(attempts)s"
            " AND NOT EXISTS (SELECT FROM pause) AND {calm}"
        ).format(first_token=self.first_token, calm=self.slot_delay[1])
        return self._answer(
            self.slot_delay,
            self._upsert(row, claimable=retries.claimable(self.table)),
            _claim_columns(
                RetryingClaimRow._fields,
                attempt=sql.SQL("COALESCE(attempt.n, attempt.deferred)"),
                retry_at=sql.SQL("attempt.retry_at"),
            ),
            more=sql.SQL(", {}").format(retries.next_attempt(self.table)),
            source="attempt",
        )

    def take_over(self) -> sql.Composed:
        taking = sql.SQL(
            "UPDATE {table} AS held SET value = %(owner)s, expire_at = {expiry}{bump}"
            " WHERE held.key = %(key)s AND held.value = %(successor)s"
            " AND held.expire_at > NOW() AND NOT EXISTS (SELECT FROM pause) AND {within}"
            " RETURNING {token}, {timeline}"
        ).format(
            table=self.table,
            expiry=LEASE_EXPIRY,
            bump=self.bump,
            within=WITHIN_CAP,
            token=self.token,
            timeline=timeline_returned(),
        )
        return self._answer(
            self.lease_delay, taking, _claim_columns(ClaimRow._fields, ttl_cap=TTL_REFUSED)
        )


def _claim_columns(fields: tuple[str, ...], **last: sql.Composable) -> sql.Composed:
    """The columns every claim answers (``ClaimRow``'s first six: whether it took the
    row, its token, a pause that refused it, the timeline, a lock delay's end), then
    ``last``, named by the reader's row type's ``fields``."""
    return select_list(
        fields,
        acquired=sql.SQL("EXISTS (SELECT FROM taken)"),
        token=sql.SQL("(SELECT token FROM taken)"),
        paused_for=sql.SQL("pause.value"),
        paused_until=PAUSED_UNTIL,
        timeline=timeline_returned(),
        delayed_until=delay_end_returned(),
        **last,
    )
