"""The one read a page makes for the slot strips it shows: each key's history rows from
the start of its strip's first slot (bounded: ``STRIP_READ_ROWS`` a key, an index scan
of ``(lock_key, started_at DESC)``), with what may reach into that slot from before it
(the newest ``SPANS_BEFORE`` rows, and a pause still on), judged as the scrape's
``WindowStarts`` are.  /metrics never pays for it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from psycopg import sql

from dislock.cli.runs.missed_slots import SPANS_BEFORE, Slot
from dislock.cli.serve.kept_runs import WindowStarts
from dislock.cli.serve.scrape import ScrapedRun, scraped_columns
from dislock.cli.serve.slot_strip import StripSource
from dislock.core.cron import EARLY_FIRE_TOLERANCE
from dislock.core.exchange import Exchange, Rows
from dislock.core.operator_commands import PAUSE_MODES, PAUSED

STRIP_READ_ROWS = 1000
"""A key's rows a strip reads at most: past it, the strip begins at the oldest read."""


def strip_rows(
    history: tuple[str, ...], locks: tuple[str, ...], sinces: Mapping[str, datetime]
) -> Exchange[list[tuple[str, ScrapedRun, bool]]]:
    """Each key's rows since its instant in ``sinces`` and those before it that may reach
    into it: (the key asked, the row, whether it began before)."""
    table = sql.Identifier(*history)
    query = sql.SQL(
        "SELECT k.lock_key, {columns}, h.started_at < k.since"
        " FROM unnest(%(keys)s::text[], %(sinces)s::timestamptz[]) AS k(lock_key, since),"
        " LATERAL ((SELECT * FROM {table} AS p WHERE p.lock_key = k.lock_key"
        " AND p.started_at >= k.since ORDER BY p.started_at DESC LIMIT {rows})"
        " UNION ALL (SELECT * FROM {table} AS p WHERE p.lock_key = k.lock_key"
        " AND p.started_at < k.since ORDER BY p.started_at DESC LIMIT {before})"
        # A pause begun earlier and planned to end later (its resume is among the rows).
        " UNION ALL SELECT * FROM {table} AS p WHERE p.lock_key = k.lock_key"
        " AND p.modes = {pause} AND p.started_at < k.since AND p.started_at >= ("
        "SELECT min(q.started_at) FROM {table} AS q WHERE q.lock_key = k.lock_key"
        " AND q.modes = {pause} AND q.outcome = {paused} AND q.slot_end > k.since)) AS h"
    ).format(
        columns=scraped_columns(locks),
        table=table,
        rows=sql.Literal(STRIP_READ_ROWS),
        before=sql.Literal(SPANS_BEFORE),
        pause=sql.Literal(PAUSE_MODES),
        paused=sql.Literal(PAUSED),
    )
    params = {"keys": list(sinces), "sinces": list(sinces.values())}
    return Exchange(query, params, _read_rows)


def _read_rows(rows: Rows) -> list[tuple[str, ScrapedRun, bool]]:
    return [(row[0], ScrapedRun._make(row[1:-1]), row[-1]) for row in rows]


def since_of(slots: Sequence[Slot]) -> datetime:
    """Where a strip's rows begin: its first slot, a start a little early counting."""
    return slots[0].start - timedelta(seconds=EARLY_FIRE_TOLERANCE)


def read_source(
    source: StripSource, slots: list[Slot], rows: Sequence[tuple[ScrapedRun, bool]]
) -> StripSource:
    """``source`` over ``slots``, judged from the rows ``strip_rows`` read of its key."""
    since = since_of(slots)
    starts = WindowStarts()
    for run, _ in rows:
        starts.take([run], since)
    ran_before = any(before for _, before in rows)
    within = [run.started_at for run, before in rows if not before]
    if len(within) >= STRIP_READ_ROWS:
        # The oldest rows were not read: only the slots after them are known.
        ran_before, oldest = True, min(within)
        slots = [slot for slot in slots if slot.start >= oldest]
    return source._replace(slots=slots, starts=starts, ran_before_window=ran_before)
