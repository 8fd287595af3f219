"""The statements of a ``dislockctl serve`` scrape, and the state a server keeps
between scrapes so that it does not reread the whole history each time
(``RunCounts``, ``WindowStarts``).  Sans-I/O: ``dislock.cli.serve.fleet_reader``
sends them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import NamedTuple, TypeVar

from psycopg import sql

from dislock.cli.runs.missed_slots import SPANS_BEFORE, Span, SpanRow, span_of
from dislock.cli.runs.run_history import still_held, tail_column
from dislock.cli.runs.slot_states import Attempt
from dislock.cli.shown import known_outcome, read
from dislock.core.exchange import Exchange, Rows, select_list
from dislock.core.failover import TIMELINE_KEY, longest_delay
from dislock.core.held_back import HELD_BACK
from dislock.core.history import TAILS
from dislock.core.operator_commands import (
    PAUSE_MODES,
    PAUSED,
    RERUN,
    Event,
    Pause,
    pause_spans,
    reruns,
)

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

    def absorb_initial(self, floor: int, grouped: Iterable[CensusRow]) -> None:
        """The first scrape's census of the runs up to ``floor``, per key and outcome
        (outcome None: unfinished)."""
        for group in grouped:
            lock_key, outcome = group.lock_key, group.outcome
            if outcome is None:
                self.pending.update(group.unfinished or ())
            else:
                self.totals[lock_key, outcome] = (
                    self.totals.get((lock_key, outcome), 0) + group.runs
                )
        self.floor = floor

    def absorb(self, new_floor: int, rows: Iterable[ScrapedRun]) -> None:
        """The runs above the old floor or pending, read in the same snapshot as
        ``new_floor``."""
        old_floor = self.floor or 0
        for row in rows:
            run_id, lock_key, outcome = row.id, row.lock_key, row.outcome
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


class RunDetails(NamedTuple):
    """What the page and the missed-slot count need of a key's latest run beyond
    ``dislock.cli.runs.run_history.latest``: the row ``run_details`` answers."""

    id: int
    owner: str
    exit_code: int | None
    cron: str | None
    cron_tz: str | None
    ran_before_window: bool
    """Whether the key ran before the start of the missed-slot window."""
    stdout_tail: str | None
    stderr_tail: str | None
    """The end of a failed run's output, for the page."""


class CensusRow(NamedTuple):
    """The runs of a key with one outcome (None: unfinished): a row of ``census``."""

    lock_key: str
    outcome: str | None
    runs: int
    unfinished: Sequence[int] | None
    """The ids of the unfinished runs (None for an outcome)."""


class ScrapedRun(NamedTuple):
    """A history row as ``RunCounts`` and ``WindowStarts`` read it: a row of
    ``window_starts`` and ``new_runs``."""

    id: int
    lock_key: str
    outcome: str | None
    """As ``serve`` counts it (``dislock.cli.shown.known_outcome``)."""
    started_at: datetime
    slot_end: datetime | None
    scheduled: bool
    """Whether the run had a schedule (always, among ``window_starts``)."""
    leased: bool
    """Whether the run took a lease: only then has it a span (``span_of_row``)."""
    ended_at: datetime | None
    running: bool
    """Without an end: whether it still holds its lock (otherwise it is abandoned)."""


class EarlierRun(NamedTuple):
    """A lease run begun before the window: a row of ``spans_before``."""

    id: int
    lock_key: str
    started_at: datetime
    leased: bool
    ended_at: datetime | None
    running: bool


class KeyEvent(NamedTuple):
    """A pause, resume or rerun event of a key (``dislock.core.operator_commands``): a row of
    ``window_events``."""

    id: int
    lock_key: str
    outcome: str
    started_at: datetime
    slot_end: datetime | None


class ScrapeStatements:
    """The statements of a scrape, on one history table, each an exchange
    (``dislock.core.exchange``) whose columns its row type names.  Each runs in the
    scrape's READ ONLY, REPEATABLE READ transaction, so they all see one moment.
    Their texts are built once, with the ``FleetReader`` that keeps them."""

    def __init__(self, history: tuple[str, ...], locks: tuple[str, ...]) -> None:
        table = sql.Identifier(*history)
        # Texts as dislockctl reads them (``dislock.cli.shown``): anyone may have
        # written them, and outcomes become label values.
        h_key = read(sql.Identifier("h", "lock_key"))
        h_outcome = known_outcome(sql.Identifier("h", "outcome"))
        self._run_details = sql.SQL(
            "SELECT {columns} FROM {table} AS h WHERE h.id = ANY(%(ids)s)"
        ).format(
            table=table,
            columns=select_list(
                RunDetails._fields,
                id=sql.SQL("h.id"),
                owner=read(sql.Identifier("h", "owner")),
                exit_code=sql.SQL("h.exit_code"),
                cron=read(sql.Identifier("h", "cron")),
                cron_tz=read(sql.Identifier("h", "cron_tz")),
                ran_before_window=sql.SQL(
                    "EXISTS (SELECT FROM {table} AS p WHERE p.lock_key = h.lock_key"
                    " AND p.started_at < %(since)s)"
                ).format(table=table),
                **{name: tail_column("h", name) for name in TAILS},
            ),
        )
        self._floor = sql.SQL(
            "SELECT COALESCE((SELECT id FROM {table}"
            " WHERE started_at < NOW() - make_interval(secs => %(recent)s)"
            " ORDER BY started_at DESC LIMIT 1), 0)"
        ).format(table=table)
        # Grouped by position: ``lock_key`` and ``outcome`` name the table's columns
        # too, which GROUP BY would take; the FILTER reads the table's outcome.
        self._census = sql.SQL(
            "SELECT {columns} FROM {table} WHERE id <= %(floor)s GROUP BY 1, 2"
        ).format(
            table=table,
            columns=select_list(
                CensusRow._fields,
                lock_key=read("lock_key"),
                outcome=known_outcome(sql.Identifier("outcome")),
                runs=sql.SQL("count(*)::bigint"),
                unfinished=sql.SQL("array_agg(id) FILTER (WHERE outcome IS NULL)"),
            ),
        )
        scraped = select_list(
            ScrapedRun._fields,
            id=sql.SQL("h.id"),
            lock_key=h_key,
            outcome=h_outcome,
            started_at=sql.SQL("h.started_at"),
            slot_end=sql.SQL("h.slot_end"),
            scheduled=sql.SQL("h.cron IS NOT NULL"),
            **span_columns("h", locks),
        )
        self._window_starts = sql.SQL(
            "SELECT {columns} FROM {table} AS h"
            " WHERE h.started_at >= %(since)s AND h.cron IS NOT NULL"
        ).format(table=table, columns=scraped)
        event = select_list(
            KeyEvent._fields,
            id=sql.SQL("h.id"),
            lock_key=h_key,
            outcome=h_outcome,
            started_at=sql.SQL("h.started_at"),
            slot_end=sql.SQL("h.slot_end"),
        )
        self._window_events = sql.SQL(
            "SELECT {event} FROM {table} AS h"
            " WHERE h.modes = {pause} AND h.started_at >= LEAST(%(since)s,"
            " (SELECT min(p.started_at) FROM {table} AS p"
            " WHERE p.modes = {pause} AND p.outcome = {paused} AND p.slot_end > %(since)s))"
            " UNION ALL SELECT {event}"
            " FROM {table} AS h WHERE h.started_at >= %(since)s AND h.outcome = {rerun}"
        ).format(
            table=table,
            event=event,
            pause=sql.Literal(PAUSE_MODES),
            paused=sql.Literal(PAUSED),
            rerun=sql.Literal(RERUN),
        )
        self._new_runs = sql.SQL(
            "SELECT {columns} FROM {table} AS h WHERE h.id > %(floor)s OR h.id = ANY(%(pending)s)"
        ).format(table=table, columns=scraped)
        self._spans_before = sql.SQL(
            "SELECT {columns}"
            " FROM unnest(%(keys)s::text[]) AS k(lock_key),"
            " LATERAL (SELECT * FROM {table} AS p WHERE p.lock_key = k.lock_key"
            " AND p.started_at < %(since)s ORDER BY p.started_at DESC"
            f" LIMIT {int(SPANS_BEFORE)}) AS b"
            " WHERE b.cron IS NOT NULL AND position('lease' IN b.modes) > 0"
            " AND (b.ended_at IS NULL OR b.ended_at > %(since)s)"
        ).format(
            table=table,
            columns=select_list(
                EarlierRun._fields,
                id=sql.SQL("b.id"),
                lock_key=read(sql.Identifier("b", "lock_key")),
                started_at=sql.SQL("b.started_at"),
                **span_columns("b", locks),
            ),
        )

    def run_details(self, ids: Sequence[int], since: datetime) -> Exchange[dict[int, RunDetails]]:
        """The ``RunDetails`` of the runs ``ids`` by id, ``since`` the start of the
        missed-slot window: primary-key lookups and one ``(lock_key, started_at)``
        index probe per run."""
        return Exchange(self._run_details, {"ids": list(ids), "since": since}, _read_details)

    def floor(self, recent: float) -> Exchange[int]:
        """``RunCounts.floor``: the id of the newest run that started more than
        ``recent`` seconds ago (0 if none)."""
        return Exchange(self._floor, {"recent": recent}, _read_floor)

    def census(self, floor: int) -> Exchange[list[CensusRow]]:
        """The first scrape's count of the runs up to ``floor``, for
        ``RunCounts.absorb_initial``."""
        return Exchange(self._census, {"floor": floor}, _reader(CensusRow))

    def window_starts(self, since: datetime) -> Exchange[list[ScrapedRun]]:
        """The first scrape's starts since ``since`` of runs with a schedule (and late
        marks), for ``WindowStarts``, through the ``(started_at)`` index."""
        return Exchange(self._window_starts, {"since": since}, _reader(ScrapedRun))

    def window_events(self, since: datetime) -> Exchange[list[KeyEvent]]:
        """The first scrape's events that tell what became of the slots since ``since``
        (``dislock.core.operator_commands.pauses``' rule, for every key).  Read once; later
        scrapes see new events among ``new_runs``."""
        return Exchange(self._window_events, {"since": since}, _reader(KeyEvent))

    def new_runs(self, floor: int, pending: Sequence[int]) -> Exchange[list[ScrapedRun]]:
        """Runs and events past ``floor`` or among ``pending``, for ``RunCounts.absorb``
        and ``WindowStarts``."""
        params = {"floor": floor, "pending": list(pending)}
        return Exchange(self._new_runs, params, _reader(ScrapedRun))

    def spans_before(self, since: datetime, keys: Sequence[str]) -> Exchange[list[EarlierRun]]:
        """The first scrape's runs of ``keys`` that began before ``since`` and may
        still have been going then (``dislock.cli.runs.missed_slots.spans``' rule)."""
        params = {"since": since, "keys": list(keys)}
        return Exchange(self._spans_before, params, _reader(EarlierRun))


Row = TypeVar("Row", CensusRow, ScrapedRun, EarlierRun, KeyEvent)


def _reader(row_type: type[Row]) -> Callable[[Rows], list[Row]]:
    """The reader of a statement answering rows of ``row_type``, by name."""

    def read_rows(rows: Rows) -> list[Row]:
        return [row_type._make(row) for row in rows]

    return read_rows


def _read_details(rows: Rows) -> dict[int, RunDetails]:
    return {details.id: details for details in map(RunDetails._make, rows)}


def _read_floor(rows: Rows) -> int:
    ((floor,),) = rows
    return int(floor)


def span_columns(run: str, locks: tuple[str, ...]) -> dict[str, sql.Composable]:
    """Whether the history row ``run`` (an alias) took a lease, its end, and whether
    it still holds its lock: the columns ``span_of_row`` reads."""
    ran = sql.Identifier(run)
    return {
        "leased": sql.SQL("position('lease' IN {}.modes) > 0").format(ran),
        "ended_at": sql.SQL("{}.ended_at").format(ran),
        "running": sql.SQL("{}.ended_at IS NULL AND {}").format(ran, still_held(run, locks)),
    }


def span_of_row(run: ScrapedRun | EarlierRun) -> Span | None:
    """A history row's span (None: not a lease run, or abandoned)."""
    return span_of(SpanRow(run.started_at, run.ended_at, run.running)) if run.leased else None


def scrape_statements(history: tuple[str, ...], locks: tuple[str, ...]) -> ScrapeStatements:
    """The statements of a scrape of ``history`` next to the lock table ``locks``."""
    return ScrapeStatements(history, locks)


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
        # Late and held-back marks: (started_at, slot_end, outcome) by id.
        self._late: dict[str, dict[int, tuple[datetime, datetime | None, str]]] = {}
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
        """A scheduled run as last read (a ``late`` or ``held_back`` mark is no run:
        its slot is late, or held back, ``dislock.core.held_back``)."""
        if outcome in ("late", HELD_BACK):
            marks = self._late.setdefault(lock_key, {})
            if run_id not in marks:
                marks[run_id] = (started_at, slot_end, outcome)
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
        """A pause, resume or rerun event of the key (``dislock.core.operator_commands``)."""
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

    def late_of(self, lock_key: str, outcome: str = "late") -> set[datetime]:
        """The ends of the slots marked ``outcome`` (``late``, or ``held_back``)."""
        marks = self._late.get(lock_key, {}).values()
        return {end for _, end, marked in marks if end is not None and marked == outcome}

    def marks_of(self, lock_key: str) -> list[tuple[datetime, datetime | None]]:
        """The late marks' starts and slots, which tell where a job's slots begin as
        its runs do (``dislock.cli.runs.missed_slots.from_first_run``)."""
        return [(start, end) for start, end, _ in self._late.get(lock_key, {}).values()]

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
