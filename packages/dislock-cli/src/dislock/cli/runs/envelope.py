"""A key's runtime envelope, learned from its history: how long its successful runs
take, and which runs fall outside that (``slow``, ``short``: docs/operator.md).

A run is ``slow`` past ``FACTOR`` times the median of its key's last ``WINDOW``
successful runs before it and past the longest of them (a job whose durations vary
widely has shown that such a run is ordinary); ``short`` under a ``FACTOR``-th of
that median.  With fewer than ``MIN_RUNS`` successes too little is known.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from statistics import median
from typing import NamedTuple

from psycopg import sql

from dislock.cli.admin import format_duration
from dislock.cli.runs.run_history import Run
from dislock.core.exchange import Exchange
from dislock.core.operator_commands import OUTCOMES as EVENTS

WINDOW = 20
"""The successful runs an envelope is learned from: the newest before the run judged."""

MIN_RUNS = 10
"""Successful runs needed before a run is judged against them."""

FACTOR = 3.0

SLOW = "slow"
SHORT = "short"

NOT_RUNS = ("late", *EVENTS)
"""Outcomes of history rows that are no run of the job (a late mark, an operator's event)."""


class Envelope(NamedTuple):
    median: float
    longest: float
    runs: int
    """How many successful runs it was learned from (``MIN_RUNS`` to ``WINDOW``)."""

    @property
    def slow_after(self) -> float:
        """A run that takes longer than this many seconds is ``slow``."""
        return max(FACTOR * self.median, self.longest)

    def judge(self, seconds: float | None, *, running: bool = False) -> str | None:
        """``SLOW``, ``SHORT`` or None for a run that took ``seconds`` (None: not
        known, an abandoned run); a ``running`` one may be slow already, not short yet."""
        if seconds is None:
            return None
        if seconds > self.slow_after:
            return SLOW
        return SHORT if not running and seconds < self.median / FACTOR else None


def envelope_of(durations: Sequence[float]) -> Envelope | None:
    """The envelope of successful runs that took ``durations`` seconds, newest first
    (the first ``WINDOW`` count); None with fewer than ``MIN_RUNS``."""
    recent = durations[:WINDOW]
    if len(recent) < MIN_RUNS:
        return None
    return Envelope(median(recent), max(recent), len(recent))


def successes_before(
    history: tuple[str, ...], runs: Sequence[tuple[str, datetime | None]]
) -> Exchange[list[Envelope | None]]:
    """For each ``(key, before)`` (before None: now), the envelope of the key's last
    ``WINDOW`` successful runs before ``before``: one index scan each, so the cost grows
    with the runs asked about, not with the history's length."""
    query = sql.SQL(
        "SELECT ARRAY(SELECT (EXTRACT(EPOCH FROM h.ended_at)"
        " - EXTRACT(EPOCH FROM h.started_at))::float8"
        " FROM {history} AS h WHERE h.lock_key = r.key AND h.outcome = 'ok'"
        " AND h.started_at < COALESCE(r.before, 'infinity')"
        " ORDER BY h.started_at DESC LIMIT {window})"
        " FROM unnest(%(keys)s::text[], %(befores)s::timestamptz[]) WITH ORDINALITY"
        " AS r(key, before, n) ORDER BY r.n"
    ).format(history=sql.Identifier(*history), window=sql.Literal(WINDOW))
    params = {"keys": [key for key, _ in runs], "befores": [before for _, before in runs]}
    return Exchange(query, params, lambda rows: [envelope_of(durations) for (durations,) in rows])


def mark(envelope: Envelope | None, outcome: str, seconds: float | None) -> str | None:
    """A run's mark against its key's ``envelope``; a late mark or an operator's
    event is no run, and has none."""
    if envelope is None or outcome in NOT_RUNS:
        return None
    return envelope.judge(seconds, running=outcome == "running")


def marks(runs: Sequence[Run], envelopes: Sequence[Envelope | None]) -> dict[int, str | None]:
    """Each run's mark (by id), against the envelope ``successes_before`` answered for it."""
    return {
        run.id: mark(envelope, run.outcome, run.duration_seconds)
        for run, envelope in zip(runs, envelopes, strict=True)
    }


def describe(envelope: Envelope) -> str:
    """An envelope in words, for ``check`` and under ``history``'s table."""
    return (
        f"median {format_duration(envelope.median)}, longest {format_duration(envelope.longest)}"
        f" of the last {envelope.runs} successful runs: slow past"
        f" {format_duration(envelope.slow_after)}, short under"
        f" {format_duration(envelope.median / FACTOR)}"
    )
