"""The statements of a ``dislockctl serve`` scrape, each an exchange with the row type
it answers (``dislock.cli.serve.fleet_reader`` sends them)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

from psycopg import sql

from dislock.cli.runs.missed_slots import SPANS_BEFORE, Span, SpanRow, span_columns, span_of
from dislock.cli.runs.run_history import tail_column
from dislock.cli.shown import known_outcome, read, rows_of
from dislock.core.exchange import Exchange, Rows, read_value, select_list
from dislock.core.failover import TIMELINE_KEY, longest_delay
from dislock.core.history import TAILS
from dislock.core.operator_commands import PAUSE_MODES, PAUSED, RERUN


def lock_delay_end_of(table: tuple[str, ...]) -> Exchange[datetime | None]:
    """The end of the longest lock delay after the latest failover; None before the first
    acquisition.  Unlike ``check``'s ``delay_state`` it does not read the server's
    timeline, which a standby (where a read-only scrape may well go) cannot tell."""
    table_id = sql.Identifier(*table)
    query = sql.SQL("SELECT {ends} AS ends FROM {table} WHERE key = {key}").format(
        ends=longest_delay(table_id, sql.SQL("expire_at")),
        table=table_id,
        key=sql.Literal(TIMELINE_KEY),
    )
    return Exchange(query, {}, read_value)


class RunDetails(NamedTuple):
    """What the page and the missed-slot count need of a key's latest run beyond
    ``run_history.latest``."""

    id: int
    owner: str
    exit_code: int | None
    cron: str | None
    cron_tz: str | None
    ran_before_window: bool
    """Whether the key ran before the start of the missed-slot window."""
    stdout_tail: str | None
    stderr_tail: str | None


class CensusRow(NamedTuple):
    """The runs of a key with one outcome (None: unfinished): a row of ``census``."""

    lock_key: str
    outcome: str | None
    runs: int
    unfinished: Sequence[int] | None
    """The ids of the unfinished runs (None for an outcome)."""


class ScrapedRun(NamedTuple):
    """A history row (a run, a mark or an event) as ``RunCounts`` and ``WindowStarts``
    read it."""

    id: int
    lock_key: str
    outcome: str | None
    """As ``serve`` counts it (``dislock.cli.shown.known_outcome``)."""
    started_at: datetime
    slot_end: datetime | None
    scheduled: bool
    leased: bool
    ended_at: datetime | None
    running: bool
    """Without an end: whether it still holds its lock (otherwise it is abandoned)."""


class ScrapeStatements:
    """The statements of a scrape on one history table, built once.  Each runs in the
    scrape's READ ONLY, REPEATABLE READ transaction, so they all see one moment."""

    def __init__(self, history: tuple[str, ...], locks: tuple[str, ...]) -> None:
        table = sql.Identifier(*history)
        self._run_details = _run_details(table)
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
        scraped = scraped_columns(locks)
        self._window_starts = sql.SQL(
            "SELECT {columns} FROM {table} AS h"
            " WHERE h.started_at >= %(since)s AND h.cron IS NOT NULL"
        ).format(table=table, columns=scraped)
        # The pauses that may reach into the window, and the reruns within it.
        self._window_events = sql.SQL(
            "SELECT {event} FROM {table} AS h"
            " WHERE h.modes = {pause} AND h.started_at >= LEAST(%(since)s,"
            " (SELECT min(p.started_at) FROM {table} AS p"
            " WHERE p.modes = {pause} AND p.outcome = {paused} AND p.slot_end > %(since)s))"
            " UNION ALL SELECT {event}"
            " FROM {table} AS h WHERE h.started_at >= %(since)s AND h.outcome = {rerun}"
        ).format(
            table=table,
            event=scraped,
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
            f" LIMIT {int(SPANS_BEFORE)}) AS h"
            " WHERE h.cron IS NOT NULL AND position('lease' IN h.modes) > 0"
            " AND (h.ended_at IS NULL OR h.ended_at > %(since)s)"
        ).format(table=table, columns=scraped)

    def run_details(self, ids: Sequence[int], since: datetime) -> Exchange[dict[int, RunDetails]]:
        """The ``RunDetails`` of the runs ``ids`` by id, ``since`` the start of the window."""
        return Exchange(self._run_details, {"ids": list(ids), "since": since}, _read_details)

    def floor(self, recent: float) -> Exchange[int]:
        """``RunCounts.floor``: the newest run that started more than ``recent`` seconds ago."""
        return Exchange(self._floor, {"recent": recent}, read_value)

    def census(self, floor: int) -> Exchange[list[CensusRow]]:
        """The first scrape's count of the runs up to ``floor``."""
        return Exchange(self._census, {"floor": floor}, rows_of(CensusRow))

    def window_starts(self, since: datetime) -> Exchange[list[ScrapedRun]]:
        """The first scrape's starts since ``since`` of runs with a schedule (and late marks)."""
        return Exchange(self._window_starts, {"since": since}, rows_of(ScrapedRun))

    def window_events(self, since: datetime) -> Exchange[list[ScrapedRun]]:
        """The first scrape's events that tell what became of the slots since ``since``;
        later scrapes see new events among ``new_runs``."""
        return Exchange(self._window_events, {"since": since}, rows_of(ScrapedRun))

    def new_runs(self, floor: int, pending: Sequence[int]) -> Exchange[list[ScrapedRun]]:
        """Runs and events past ``floor`` or among ``pending``."""
        params = {"floor": floor, "pending": list(pending)}
        return Exchange(self._new_runs, params, rows_of(ScrapedRun))

    def spans_before(self, since: datetime, keys: Sequence[str]) -> Exchange[list[ScrapedRun]]:
        """The first scrape's lease runs of ``keys`` that began before ``since`` and may
        still have been going then (``missed_slots.spans``' rule)."""
        params = {"since": since, "keys": list(keys)}
        return Exchange(self._spans_before, params, rows_of(ScrapedRun))


def scraped_columns(locks: tuple[str, ...]) -> sql.Composed:
    """A ``ScrapedRun``'s columns of the history row ``h``."""
    return select_list(
        ScrapedRun._fields,
        id=sql.SQL("h.id"),
        # Texts as dislockctl reads them (``dislock.cli.shown``): anyone may have
        # written them, and outcomes become label values.
        lock_key=read(sql.Identifier("h", "lock_key")),
        outcome=known_outcome(sql.Identifier("h", "outcome")),
        started_at=sql.SQL("h.started_at"),
        slot_end=sql.SQL("h.slot_end"),
        scheduled=sql.SQL("h.cron IS NOT NULL"),
        leased=sql.SQL("position('lease' IN h.modes) > 0"),  # it has a span
        **span_columns("h", locks),
    )


def _run_details(table: sql.Identifier) -> sql.Composed:
    return sql.SQL("SELECT {columns} FROM {table} AS h WHERE h.id = ANY(%(ids)s)").format(
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


def _read_details(rows: Rows) -> dict[int, RunDetails]:
    return {details.id: details for details in map(RunDetails._make, rows)}


def span_of_row(run: ScrapedRun) -> Span | None:
    """A history row's span (None: not a lease run, or abandoned)."""
    return span_of(SpanRow(run.started_at, run.ended_at, run.running)) if run.leased else None
