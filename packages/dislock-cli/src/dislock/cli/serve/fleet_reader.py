"""``FleetReader``: the snapshots ``dislockctl serve`` shows, read over one kept
connection, with what is costly to recompute kept between scrapes."""

from __future__ import annotations

import contextlib
import logging
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

import psycopg

from dislock.cli.admin import DATABASE_NOW
from dislock.cli.diagnosis import describe_database_error
from dislock.cli.far_times import for_reading
from dislock.cli.lock_rows import columns, listing
from dislock.cli.runs.envelope import successes_before
from dislock.cli.runs.missed_slots import end_of, from_first_run
from dislock.cli.runs.run_history import Run, runs
from dislock.cli.runs.run_history import latest as latest_runs
from dislock.cli.sending import send
from dislock.cli.serve.fleet_status import MISSED_WINDOW, FleetSnapshot, LatestRow, build_snapshot
from dislock.cli.serve.kept_runs import RunCounts, WindowStarts
from dislock.cli.serve.scrape import ScrapedRun, ScrapeStatements, lock_delay_end_of
from dislock.cli.serve.slot_counts import state_counts
from dislock.cli.serve.slot_strip import (
    STRIP_BOUNDARY_BUDGET,
    STRIP_SLOTS,
    EarlierSlots,
    StripSource,
)
from dislock.cli.serve.slot_windows import ScheduleWindows
from dislock.cli.serve.strip_reads import read_source, since_of, strip_rows
from dislock.core.audit_trail import Entry, audit_table, entries, trail_readable
from dislock.core.dsn import connection_kwargs, scrub
from dislock.core.grant_catalog import audit

T = TypeVar("T")

logger = logging.getLogger("dislock.serve")

CONNECTION_WAIT_SECONDS = 10.0
"""A request waits this long for the connection another request is using."""

SCRAPE_CONNECT_TIMEOUT = 3.0
"""Seconds a scrape waits for a connection: Prometheus gives up after 10 s by default."""

SCRAPE_STATEMENT_TIMEOUT_MS = 5000
"""A scrape's statements give up after this long: a slow database reads as down,
not as a scrape that hangs until Prometheus gives up on it."""

KEY_RUNS_SINCE = timedelta(days=36500)
"""A key's page lists its newest runs however old (an index scan of its key, newest first)."""

RECENT_SECONDS = 60
"""A history row is read again while its run started less than this long ago: a
start statement that took its id earlier may commit a little later (history
statements are cancelled after ``HISTORY_TIMEOUT``, well within this)."""


class _Turns:
    """The kept connection, lent to one request at a time, a waiting scrape before every
    waiting page view: a page reloaded in many tabs must not make Prometheus's scrapes
    time out."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._busy = False
        self._scrapes = 0  # waiting

    def take(self, *, scrape: bool, timeout: float) -> bool:
        with self._changed:
            self._scrapes += scrape
            try:
                free = self._changed.wait_for(
                    lambda: not self._busy and (scrape or not self._scrapes), timeout
                )
                # One that gave up leaves the connection to whoever has it: two requests
                # on one connection, one closing it as the other reads, crashed the
                # process (libpq freed under a read: security review #61).
                self._busy = self._busy or free
                return free
            finally:
                self._scrapes -= scrape
                self._changed.notify_all()  # a scrape that gave up lets page views in

    def give_back(self) -> None:
        with self._changed:
            self._busy = False
            self._changed.notify_all()


class FleetReader:
    """Reads snapshots over one connection, reconnecting after a failure, keeping the run
    counts (``RunCounts``) and each key's slots (``ScheduleWindows``).  The connection
    is held only while the database is read; the slots are computed under a lock of
    their own, so that their cost never makes another request wait for the connection."""

    def __init__(self, url: str, table: tuple[str, ...], history: tuple[str, ...]) -> None:
        self._url = url
        self._table = table
        self._history = history
        self._statements = ScrapeStatements(history, table)
        self._conn: psycopg.Connection[Any] | None = None
        self._turns = _Turns()
        self._was_up: bool | None = None
        self._counts = RunCounts()
        self._starts = WindowStarts()
        self._missed: dict[str, tuple[tuple[Any, ...], dict[str, int]]] = {}
        self._windows = ScheduleWindows()
        self._earlier = EarlierSlots()
        # Reads are numbered, and their slots computed in that order, so that the
        # windows never step back in time when two requests overlap.
        self._windows_turn = threading.Condition()
        self._reads = self._computed = 0

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            kwargs = connection_kwargs(self._url, SCRAPE_CONNECT_TIMEOUT)
            kwargs["application_name"] = "dislockctl-serve"
            self._conn = for_reading(psycopg.connect(self._url, **kwargs))
        return self._conn

    def snapshot(self, *, scrape: bool = False) -> FleetSnapshot:
        """The fleet now; ``scrape``: for /metrics, which goes first (``_Turns``)."""
        if not self._turns.take(scrape=scrape, timeout=CONNECTION_WAIT_SECONDS):
            self._report(False, "another request has been reading for too long")
            return FleetSnapshot(datetime.now(timezone.utc), up=False)
        try:
            conn = self._connect()
            with conn.transaction():
                # One consistent, read-only view; a write here would be refused by
                # the server itself, whatever the SQL said.
                conn.execute(
                    "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;"
                    f" SET LOCAL statement_timeout = {int(SCRAPE_STATEMENT_TIMEOUT_MS)}"
                )
                now = send(conn, DATABASE_NOW)
                since = now - MISSED_WINDOW
                lock_rows = send(conn, listing(self._table))
                latest = self._latest(conn, since)
                self._follow_runs(conn, since, [row.run.key for row in latest])
                delay_ends = send(conn, lock_delay_end_of(self._table))
                loopholes = send(conn, audit(self._table))
            # Copies, for the work done once the connection is free again: the next
            # scrape's reading does not change them.
            starts, runs_total = self._starts.copy(), self._counts.by_key()
            self._reads += 1
            turn = self._reads
        except psycopg.Error as exc:
            self._lost(exc)
            return FleetSnapshot(datetime.now(timezone.utc), up=False)
        finally:
            self._turns.give_back()
        self._report(True, "")
        with self._windows_turn:
            self._windows_turn.wait_for(lambda: self._computed == turn - 1)
            try:
                slot_counts, next_slots, strips = self._schedules(latest, starts, since, now)
            finally:
                self._computed = turn
                self._windows_turn.notify_all()
        return build_snapshot(
            now,
            lock_rows,
            latest,
            runs_total=runs_total,
            slot_counts=slot_counts,
            next_slots=next_slots,
            timeline_expire_at=delay_ends,
            grant_loopholes=len(loopholes),
        )._replace(strips=strips)

    def _read_only(self, reading: Callable[[psycopg.Connection[Any]], T]) -> T | None:
        """What ``reading`` reads in a read-only transaction of its own, on a page view's
        turn; None: not read."""
        if not self._turns.take(scrape=False, timeout=CONNECTION_WAIT_SECONDS):
            return None
        try:
            conn = self._connect()
            with conn.transaction():
                conn.execute(
                    "SET TRANSACTION READ ONLY;"
                    f" SET LOCAL statement_timeout = {int(SCRAPE_STATEMENT_TIMEOUT_MS)}"
                )
                return reading(conn)
        except psycopg.Error as exc:
            self._lost(exc)
            return None
        finally:
            self._turns.give_back()

    def runs_of(self, key: str, limit: int) -> list[Run] | None:
        """``key``'s newest ``limit`` runs (a key's page), read only; None: not read."""
        found = runs(self._history, self._table, key, KEY_RUNS_SINCE, limit)
        return self._read_only(lambda conn: send(conn, found))

    def audit_of(self, key: str, limit: int) -> list[Entry] | str:
        """``key``'s newest ``limit`` rows of the audit trail, or why there are none."""
        trail = audit_table(self._table)

        def read(conn: psycopg.Connection[Any]) -> list[Entry] | str:
            readable = send(conn, trail_readable(trail))
            if readable is None:
                return f"no audit trail: {'.'.join(trail)} does not exist (init creates it)"
            if not readable:
                return "the audit trail is not readable by this role (a reader's grant reads it)"
            return send(conn, entries(trail, key, None, newest=limit))

        found = self._read_only(read)
        if found is None:
            return "the audit trail was not read: the database did not answer"
        return found

    def with_strips(self, snapshot: FleetSnapshot, keys: Iterable[str]) -> FleetSnapshot:
        """``snapshot`` with the strips of ``keys`` over their last ``STRIP_SLOTS`` slots,
        before the window too; as it was when their rows could not be read."""
        budget = [STRIP_BOUNDARY_BUDGET]
        slots = {}
        for key in keys:
            source = snapshot.strips.get(key)
            if source is not None:
                found = self._earlier.slots(source, snapshot.now, budget)
                if found:
                    slots[key] = found
        sinces = {key: since_of(found) for key, found in slots.items()}
        statement = strip_rows(self._history, self._table, sinces)
        rows = self._read_only(lambda conn: send(conn, statement)) if sinces else []
        if rows is None:
            return snapshot
        by_key: dict[str, list[tuple[ScrapedRun, bool]]] = {key: [] for key in slots}
        for key, run, before in rows:
            by_key[key].append((run, before))
        strips = dict(snapshot.strips)
        for key, found in slots.items():
            strips[key] = read_source(strips[key], found, by_key[key])
        return snapshot._replace(strips=strips)

    def _latest(self, conn: psycopg.Connection[Any], since: datetime) -> list[LatestRow]:
        """Each key's latest run, with the details the page and the missed-slot count need."""
        found = send(conn, latest_runs(self._history, self._table))
        ids = [run.run_id for run in found if run.run_id is not None]
        details = send(conn, self._statements.run_details(ids, since))
        # Every scrape: a running run may pass its envelope between two of them.
        ran = [(run.key, run.started_at) for run in found if run.run_id is not None]
        learned = send(conn, successes_before(self._history, ran))
        envelopes = dict(zip(ids, learned, strict=True))
        # Keys that never ran (or whose run was pruned in between): the lock rows tell.
        return [
            LatestRow(run, details[run.run_id], envelopes[run.run_id])
            for run in found
            if run.run_id in details
        ]

    def _follow_runs(self, conn: psycopg.Connection[Any], since: datetime, keys: list[str]) -> None:
        """Bring the run counts and the window's starts and spans up to date, reading (after
        the first scrape) only the runs that are new or were unfinished."""
        statements = self._statements
        floor = send(conn, statements.floor(RECENT_SECONDS))
        if self._counts.floor is None:  # the first scrape counts the history once
            census = send(conn, statements.census(floor))
            self._counts.absorb_initial(floor, census)
        if not self._starts.loaded:
            self._starts.take(send(conn, statements.window_starts(since)), since)
            for event in send(conn, statements.window_events(since)):
                self._starts.add_event(event)
            # Runs begun before the window may cover its first slots; later scrapes
            # see them again only while they are unfinished (pending).
            for earlier in send(conn, statements.spans_before(since, keys)):
                self._starts.set_span(earlier)
            self._starts.loaded = True
        assert self._counts.floor is not None  # set by the census
        rows = send(conn, statements.new_runs(self._counts.floor, sorted(self._counts.pending)))
        self._counts.absorb(floor, rows)
        self._starts.take(rows, since)
        self._starts.trim(since)

    def _schedules(
        self, latest: list[LatestRow], starts: WindowStarts, since: datetime, now: datetime
    ) -> tuple[dict[str, dict[str, int]], dict[str, datetime], dict[str, StripSource]]:
        """How many slots of each state, the next slot and what the slot strip is computed
        from, of every key whose latest run had a schedule."""
        counted: dict[str, dict[str, int]] = {}
        next_slots: dict[str, datetime] = {}
        strips: dict[str, StripSource] = {}
        found = self._windows.scrape(
            ((row.run.key, row.more.cron, row.more.cron_tz) for row in latest if row.more.cron),
            since,
            now,
        )
        for note in found.notes:
            logger.warning("%s", note)
        for row in latest:
            key, more = row.run.key, row.more
            window = found.windows.get(key)
            if more.cron is None or window is None:
                continue
            if window.next_slot is not None:
                next_slots[key] = window.next_slot
            if window.slots is None:
                continue  # unreadable, too dense, or not computed yet: no count, not a wrong one
            assert row.run.started_at is not None  # it ran
            # The last slots as they are now: a later scrape appends to the window's list.
            last = window.slots[-STRIP_SLOTS:]
            strips[key] = StripSource(
                last,
                starts,
                key,
                more.ran_before_window,
                row.run.started_at,
                row.envelope,
                more.cron,
                more.cron_tz,
                window.next_slot,
            )
            # Recounted only when the key's runs or its schedule's slots changed, or a slot
            # ended: one whose attempts all failed counts once it is over (a retry may still
            # come before), one reopened and not run again is retrying until then, missed after.
            schedule = (more.cron, more.cron_tz or "UTC")
            ended = bisect_right(window.slots, now, key=end_of)
            inputs = (schedule, window.version, starts.version(key), more.ran_before_window, ended)
            cached = self._missed.get(key)
            if cached is None or cached[0] != inputs:
                slots = window.slots
                if not more.ran_before_window:
                    # A job new within the window: the slots before its first run are not missed.
                    first = starts.of(key) + starts.marks_of(key)
                    slots = from_first_run(slots, first or [(row.run.started_at, None)])
                counts = state_counts(
                    slots,
                    starts.attempts_of(key),
                    now=now,
                    **starts.judged_by(key),
                )
                cached = self._missed[key] = (inputs, counts)
            counted[key] = cached[1]
        return counted, next_slots, strips

    def check_tables(self) -> str | None:
        """At start-up: what is missing, or None.  A database that does not answer is not an
        error here: the server starts and reports it as down."""
        try:
            conn = self._connect()
            for table, what, create in (
                (self._table, "lock table", "init"),
                (self._history, "history table", "init --history"),
            ):
                if not send(conn, columns(table)):
                    return (
                        f"{what} {'.'.join(table)} does not exist; create it with"
                        f" `dislockctl URL_VARIABLE {create}`"
                    )
        except psycopg.Error as exc:
            self._lost(exc)
        return None

    def _lost(self, exc: psycopg.Error) -> None:
        self.close()
        self._report(False, describe_database_error(exc, table_parts=self._table, url=self._url))

    def _report(self, up: bool, why: str) -> None:
        if up != self._was_up:
            if up:
                logger.info("the database answers")
            else:
                logger.warning("the database did not answer: %s", scrub(why, self._url))
        self._was_up = up

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()
