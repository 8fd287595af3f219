"""The statements of a ``dislockctl serve`` scrape, and the state a server keeps
between scrapes so that it does not reread the whole history each time
(``RunCounts``, ``WindowStarts``).  Sans-I/O: ``dislock.cli.serve.server`` runs them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from psycopg import sql

from dislock.cli.runs.missed_slots import SPANS_BEFORE, Span, SpanRow, span_of
from dislock.cli.runs.run_history import still_held, tail_column
from dislock.cli.runs.slot_states import Attempt
from dislock.cli.shown import known_outcome, read
from dislock.core.events import PAUSE_MODES, PAUSED, RERUN, Event, Pause, pause_spans, reruns
from dislock.core.exchange import Exchange, Rows
from dislock.core.failover import TIMELINE_KEY, longest_delay
from dislock.core.history import TAILS

SCRAPE_CONNECT_TIMEOUT = 3.0
"""Seconds a scrape waits for a connection: Prometheus gives up after 10 s by default."""

SCRAPE_STATEMENT_TIMEOUT_MS = 5000
"""A scrape's statements give up after this long: a slow database reads as down,
not as a scrape that hangs until Prometheus gives up on it."""


def _read_delay_end(rows: Rows) -> datetime | None:
    if not rows:
        return None
    ((ends,),) = rows
    return ends if isinstance(ends, datetime) else None


def lock_delay_end_of(table: tuple[str, ...]) -> Exchange[datetime | None]:
    """The end of the longest lock delay after the latest failover
    (``dislock.core.failover``); None before the first acquisition.  Unlike
    ``check``'s ``delay_state`` it does not read the server's timeline, which a
    standby (where a read-only scrape may well go) cannot tell."""
    table_id = sql.Identifier(*table)
    query = sql.SQL("SELECT {ends} AS ends FROM {table} WHERE key = {key}").format(
        ends=longest_delay(table_id, sql.SQL("expire_at")),
        table=table_id,
        key=sql.Literal(TIMELINE_KEY),
    )
    return Exchange(query, {}, _read_delay_end)


RECENT_SECONDS = 60
"""A history row is read again while its run started less than this long ago: a
start statement that took its id earlier may commit a little later (history
statements are cancelled after ``HISTORY_TIMEOUT``, well within this)."""


class RunCounts:
    """``dislock_runs_total``, kept by reading only what is new since the last scrape.

    Counting a million history rows on every scrape would take most of the time a
    scrape may take; instead the first scrape counts every finished run once, and
    each later one reads the rows past ``floor`` (the newest run that started more
    than ``RECENT_SECONDS`` ago: every row below it is committed) plus the runs it
    saw unfinished.  A run is counted once, when it is first seen finished.  So the
    totals only grow: pruning the history does not lower them, and they restart
    from the table when ``serve`` restarts, which Prometheus reads as a reset.
    """

    def __init__(self) -> None:
        self.totals: dict[tuple[str, str], int] = {}
        self.floor: int | None = None
        """Every run with an id up to this was seen (counted, or in ``pending``)."""
        self.pending: set[int] = set()
        """Runs at or below ``floor`` not finished when last seen."""
        self._counted: set[int] = set()
        """Finished runs above ``floor`` already counted."""

    def absorb_initial(
        self, floor: int, grouped: Sequence[tuple[str, str | None, int, Sequence[int] | None]]
    ) -> None:
        """The first scrape's census of the runs up to ``floor``: ``(lock_key, outcome,
        count, ids of the unfinished)`` per key and outcome (outcome None: unfinished)."""
        for lock_key, outcome, count, unfinished in grouped:
            if outcome is None:
                self.pending.update(unfinished or ())
            else:
                self.totals[lock_key, outcome] = self.totals.get((lock_key, outcome), 0) + count
        self.floor = floor

    def absorb(self, new_floor: int, rows: Iterable[Sequence[Any]]) -> None:
        """Rows ``(id, lock_key, outcome, ...)`` above the old floor or pending, read in
        the same snapshot as ``new_floor``."""
        old_floor = self.floor or 0
        for run_id, lock_key, outcome, *_ in rows:
            # Below the old floor only a pending run is news; the rest was counted.
            fresh = run_id > old_floor or run_id in self.pending
            if outcome is not None and fresh and run_id not in self._counted:
                self.totals[lock_key, outcome] = self.totals.get((lock_key, outcome), 0) + 1
                self.pending.discard(run_id)
                self._counted.add(run_id)
            elif outcome is None and run_id <= new_floor:
                self.pending.add(run_id)
        # Below the floor a finished run is never read again, so it need not be remembered.
        self._counted = {run_id for run_id in self._counted if run_id > new_floor}
        self.floor = max(new_floor, self.floor or 0)

    def by_key(self) -> dict[str, dict[str, int]]:
        found: dict[str, dict[str, int]] = {}
        for (lock_key, outcome), count in self.totals.items():
            found.setdefault(lock_key, {})[outcome] = count
        return found


class ScrapeStatements(NamedTuple):
    """The statements of a scrape, on one history table.  Each runs in the scrape's
    READ ONLY, REPEATABLE READ transaction, so they all see one moment."""

    run_details: sql.Composed
    """What the page and the missed-slot count need of the runs %(ids)s beyond
    ``latest_query``: id, owner, exit code, cron expression and zone, whether the key ran
    before %(since)s (the start of the missed-slot window), the tails of its stdout and
    stderr: primary-key lookups and one ``(lock_key, started_at)`` index probe per run."""
    floor: sql.Composed
    """``RunCounts.floor``: the id of the newest run that started more than
    %(recent)s seconds ago (0 if none)."""
    census: sql.Composed
    """The first scrape's count of the runs up to %(floor)s, for ``RunCounts.absorb_initial``."""
    window_starts: sql.Composed
    """The first scrape's starts since %(since)s of runs with a schedule (and late
    marks), for ``WindowStarts``, through the ``(started_at)`` index: id, lock_key,
    outcome, started_at, slot_end, then the run's span columns (``span_columns``)."""
    window_events: sql.Composed
    """The first scrape's events that tell what became of the slots since %(since)s
    (``dislock.core.events.pauses``' rule, for every key): id, lock_key,
    outcome, started_at, slot_end.  Read once; later scrapes see new events among
    ``new_runs``."""
    new_runs: sql.Composed
    """Runs and events past %(floor)s or among %(pending)s, for ``RunCounts.absorb``
    and ``WindowStarts``: id, lock_key, outcome, started_at, slot_end, has a
    schedule, then the span columns."""
    spans_before: sql.Composed
    """The first scrape's runs of the keys %(keys)s that began before %(since)s and
    may still have been going then (``dislock.cli.runs.missed_slots.spans``' rule): id,
    lock_key, started_at, then the span columns."""


SPAN_COLUMNS = (
    " position('lease' IN {run}.modes) > 0, {run}.ended_at, {run}.ended_at IS NULL AND {held}"
)
"""Whether the run took a lease, its end, and whether it still holds its lease
(``dislock.cli.runs.missed_slots.span_of``'s arguments, after the first)."""


def span_of_row(
    started_at: datetime, leased: bool, ended_at: datetime | None, running: bool
) -> Span | None:
    """A history row's span (None: not a lease run, or abandoned)."""
    return span_of(SpanRow(started_at, ended_at, running)) if leased else None


def scrape_statements(history: tuple[str, ...], locks: tuple[str, ...]) -> ScrapeStatements:
    """The statements of a scrape of ``history`` (each ``{table}`` below) next to
    the lock table ``locks``."""
    table = sql.Identifier(*history)

    def spans(run: str) -> sql.Composed:
        return sql.SQL(SPAN_COLUMNS).format(run=sql.Identifier(run), held=still_held(run, locks))

    def on_history(text: str) -> sql.Composed:
        # Texts as dislockctl reads them (``dislock.cli.shown``): anyone may have
        # written them, and outcomes become label values.
        return sql.SQL(text).format(
            table=table,
            spans=spans("h"),
            spans_b=spans("b"),
            key=read("lock_key"),
            h_key=read(sql.Identifier("h", "lock_key")),
            b_key=read(sql.Identifier("b", "lock_key")),
            outcome=known_outcome(sql.Identifier("outcome")),
            h_outcome=known_outcome(sql.Identifier("h", "outcome")),
            owner=read(sql.Identifier("h", "owner")),
            cron=read(sql.Identifier("h", "cron")),
            cron_tz=read(sql.Identifier("h", "cron_tz")),
            paused=sql.Literal(PAUSED),
            **{name: tail_column("h", name) for name in TAILS},
            pause=sql.Literal(PAUSE_MODES),
            rerun=sql.Literal(RERUN),
        )

    return ScrapeStatements(
        run_details=on_history(
            "SELECT h.id, {owner}, h.exit_code, {cron}, {cron_tz},"
            " EXISTS (SELECT FROM {table} AS p WHERE p.lock_key = h.lock_key"
            " AND p.started_at < %(since)s),"
            # The end of a failed run's output, for the page.
            " {stdout_tail}, {stderr_tail}"
            " FROM {table} AS h WHERE h.id = ANY(%(ids)s)"
        ),
        floor=on_history(
            "SELECT COALESCE((SELECT id FROM {table}"
            " WHERE started_at < NOW() - make_interval(secs => %(recent)s)"
            " ORDER BY started_at DESC LIMIT 1), 0)"
        ),
        census=on_history(
            "SELECT {key}, {outcome}, count(*)::bigint,"
            " array_agg(id) FILTER (WHERE outcome IS NULL)"
            " FROM {table} WHERE id <= %(floor)s GROUP BY 1, 2"
        ),
        window_starts=on_history(
            "SELECT h.id, {h_key}, {h_outcome}, h.started_at, h.slot_end,{spans} FROM {table} AS h"
            " WHERE h.started_at >= %(since)s AND h.cron IS NOT NULL"
        ),
        window_events=on_history(
            "SELECT h.id, {h_key}, {h_outcome}, h.started_at, h.slot_end FROM {table} AS h"
            " WHERE h.modes = {pause} AND h.started_at >= LEAST(%(since)s,"
            " (SELECT min(p.started_at) FROM {table} AS p"
            " WHERE p.modes = {pause} AND p.outcome = {paused} AND p.slot_end > %(since)s))"
            " UNION ALL SELECT h.id, {h_key}, {h_outcome}, h.started_at, h.slot_end"
            " FROM {table} AS h WHERE h.started_at >= %(since)s AND h.outcome = {rerun}"
        ),
        new_runs=on_history(
            "SELECT h.id, {h_key}, {h_outcome}, h.started_at, h.slot_end, h.cron IS NOT NULL,"
            "{spans} FROM {table} AS h WHERE h.id > %(floor)s OR h.id = ANY(%(pending)s)"
        ),
        spans_before=on_history(
            "SELECT b.id, {b_key}, b.started_at,{spans_b}"
            " FROM unnest(%(keys)s::text[]) AS k(lock_key),"
            " LATERAL (SELECT * FROM {table} AS p WHERE p.lock_key = k.lock_key"
            " AND p.started_at < %(since)s ORDER BY p.started_at DESC"
            f" LIMIT {int(SPANS_BEFORE)}) AS b"
            " WHERE b.cron IS NOT NULL AND position('lease' IN b.modes) > 0"
            " AND (b.ended_at IS NULL OR b.ended_at > %(since)s)"
        ),
    )


class WindowStarts:
    """Each key's scheduled runs in the missed-slot window, and its pauses, kept
    across scrapes.

    The first scrape reads the window (``ScrapeStatements.window_starts`` and
    ``window_pauses``); later ones only add the runs and events
    ``ScrapeStatements.new_runs`` returns anyway (a run again while it has no end,
    so that its outcome is known once it ends), and drop those the window left.
    It keeps the spans of the key's lease runs as well (``set_span``): those that
    were still going at some point of the window, which cover the slots they
    overlap (``dislock.cli.runs.missed_slots.split_covered``).
    ``version`` changes with a key's runs, spans or pauses, so that its slot
    states are only recomputed when they (or its schedule's slots) changed.
    """

    def __init__(self) -> None:
        self.loaded = False
        self._by_key: dict[str, dict[int, Attempt]] = {}
        self._late: dict[str, dict[int, tuple[datetime, datetime | None]]] = {}
        self._events: dict[str, dict[int, Event]] = {}
        self._spans: dict[str, dict[int, Span]] = {}
        self._versions: dict[str, int] = {}

    def _changed(self, lock_key: str) -> None:
        self._versions[lock_key] = self._versions.get(lock_key, 0) + 1

    def set_span(self, run_id: int, lock_key: str, span: Span | None) -> None:
        """The run's span as last read (None: none, or no longer: it was abandoned)."""
        spans = self._spans.setdefault(lock_key, {})
        if spans.get(run_id) == span:
            return
        if span is None:
            del spans[run_id]
        else:
            spans[run_id] = span
        self._changed(lock_key)

    def spans_of(self, lock_key: str) -> list[Span]:
        return list(self._spans.get(lock_key, {}).values())

    def add(
        self,
        run_id: int,
        lock_key: str,
        started_at: datetime,
        slot_end: datetime | None,
        outcome: str | None = None,
        running: bool = False,
    ) -> None:
        """A scheduled run as last read (a ``late`` mark is no run: its slot is late)."""
        if outcome == "late":
            marks = self._late.setdefault(lock_key, {})
            if run_id not in marks:
                marks[run_id] = (started_at, slot_end)
                self._changed(lock_key)
            self._by_key.get(lock_key, {}).pop(run_id, None)
            return
        runs = self._by_key.setdefault(lock_key, {})
        attempt = Attempt(started_at, slot_end, outcome, running)
        if runs.get(run_id) != attempt:
            runs[run_id] = attempt
            self._changed(lock_key)

    def add_event(
        self,
        run_id: int,
        lock_key: str,
        outcome: str,
        started_at: datetime,
        slot_end: datetime | None,
    ) -> None:
        """A pause, resume or rerun event of the key (``dislock.core.events``)."""
        found = self._events.setdefault(lock_key, {})
        if run_id not in found:
            found[run_id] = Event(started_at, slot_end, outcome)
            self._changed(lock_key)

    def trim(self, since: datetime) -> None:
        for by_key in (self._by_key, self._late):
            for lock_key, runs in by_key.items():
                stale = [run_id for run_id, run in runs.items() if run[0] < since]
                for run_id in stale:
                    del runs[run_id]
                if stale:
                    self._changed(lock_key)
        for lock_key, events in self._events.items():
            # A rerun matters while it is in the window; a pause or resume while a
            # pause from it or before it may reach into the window.
            pauses = pause_spans(events.values())
            reaching = bool(pauses) and pauses[-1].end > since
            stale = [
                run_id
                for run_id, event in events.items()
                if (event.started_at < since if event.outcome == RERUN else not reaching)
            ]
            for run_id in stale:
                del events[run_id]
            if stale:
                self._changed(lock_key)
        for lock_key, spans in self._spans.items():
            # A span still matters while it reaches into the window.
            over = [run for run, span in spans.items() if span.end and span.end <= since]
            for run in over:
                del spans[run]
            if over:
                self._changed(lock_key)

    def of(self, lock_key: str) -> list[tuple[datetime, datetime | None]]:
        return [(run.started_at, run.slot_end) for run in self.attempts_of(lock_key)]

    def attempts_of(self, lock_key: str) -> list[Attempt]:
        return list(self._by_key.get(lock_key, {}).values())

    def late_of(self, lock_key: str) -> set[datetime]:
        return {end for _, end in self._late.get(lock_key, {}).values() if end is not None}

    def marks_of(self, lock_key: str) -> list[tuple[datetime, datetime | None]]:
        """The late marks' starts and slots, which tell where a job's slots begin as
        its runs do (``dislock.cli.runs.missed_slots.from_first_run``)."""
        return list(self._late.get(lock_key, {}).values())

    def pauses_of(self, lock_key: str) -> list[Pause]:
        return pause_spans(self._events.get(lock_key, {}).values())

    def reruns_of(self, lock_key: str) -> dict[datetime, datetime]:
        return reruns(self._events.get(lock_key, {}).values())

    def copy(self) -> WindowStarts:
        """A copy that the original's later changes leave alone: every per-key map is
        copied (their values are immutable)."""
        clone = WindowStarts.__new__(WindowStarts)
        for name, value in vars(self).items():
            if isinstance(value, dict):
                value = {k: dict(v) if isinstance(v, dict) else v for k, v in value.items()}
            setattr(clone, name, value)
        return clone

    def version(self, lock_key: str) -> int:
        return self._versions.get(lock_key, 0)
