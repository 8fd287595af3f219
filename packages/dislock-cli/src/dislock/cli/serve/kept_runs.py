"""What ``dislockctl serve`` keeps between scrapes so that it does not reread the whole
history each time: the run counts (``RunCounts``) and each key's runs, marks, events
and spans in the missed-slot window (``WindowStarts``).  Plain data."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from typing import Any, TypedDict

from dislock.cli.runs.missed_slots import Attempt, Span
from dislock.cli.serve.scrape import CensusRow, ScrapedRun, span_of_row
from dislock.core.after import HELD_BACK
from dislock.core.operator_commands import PAUSED, RERUN, RESUMED, Event, Pause, pause_spans, reruns


class RunCounts:
    """``dislock_runs_total``, kept by reading only what is new since the last scrape.

    Counting a million history rows on every scrape would take most of the time a
    scrape may take; instead the first scrape counts every finished run once, and each
    later one reads the rows past ``floor`` (every row below it is committed) plus the
    runs it saw unfinished.  A run is counted once, when first seen finished, so the
    totals only grow; they restart when ``serve`` does, which Prometheus reads as a reset.
    """

    def __init__(self) -> None:
        self.totals: Counter[tuple[str, str]] = Counter()
        self.floor: int | None = None
        """Every run with an id up to this was seen (counted, or in ``pending``)."""
        self.pending: set[int] = set()
        """Runs at or below ``floor`` not finished when last seen."""
        self._counted: set[int] = set()
        """Finished runs above ``floor`` already counted."""

    def absorb_initial(self, floor: int, grouped: Iterable[CensusRow]) -> None:
        """The first scrape's census of the runs up to ``floor``."""
        for group in grouped:
            if group.outcome is None:
                self.pending.update(group.unfinished or ())
            else:
                self.totals[group.lock_key, group.outcome] += group.runs
        self.floor = floor

    def absorb(self, new_floor: int, rows: Iterable[ScrapedRun]) -> None:
        """The runs above the old floor or pending, read in the snapshot of ``new_floor``."""
        old_floor = self.floor or 0
        for row in rows:
            run_id, lock_key, outcome = row.id, row.lock_key, row.outcome
            # Below the old floor only a pending run is news; the rest was counted.
            fresh = run_id > old_floor or run_id in self.pending
            if outcome is not None and fresh and run_id not in self._counted:
                self.totals[lock_key, outcome] += 1
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


class Marks(TypedDict):
    """What ``slot_states`` and ``state_counts`` judge a key's slots by, beside its attempts."""

    late: set[datetime]
    held_back: dict[datetime, str | None]
    pauses: list[Pause]
    spans: list[Span]
    reruns: dict[datetime, datetime]


class WindowStarts:
    """Each key's scheduled runs, marks, events and lease spans in the missed-slot window,
    kept across scrapes: the first scrape reads the window, later ones only add what
    ``ScrapeStatements.new_runs`` returns anyway and ``trim`` what the window left.
    ``version`` changes with a key's entries, so that its slot states are recomputed
    only when they (or its schedule's slots) changed.
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

    def set_span(self, run: ScrapedRun) -> None:
        """The run's span as last read (none, or no longer: it was abandoned)."""
        spans = self._spans.setdefault(run.lock_key, {})
        span = span_of_row(run)
        if spans.get(run.id) == span:
            return
        if span is None:
            del spans[run.id]
        else:
            spans[run.id] = span
        self._changed(run.lock_key)

    def spans_of(self, lock_key: str) -> list[Span]:
        return list(self._spans.get(lock_key, {}).values())

    def add(self, run: ScrapedRun) -> None:
        """A scheduled run as last read (a ``late`` or ``held_back`` mark is no run)."""
        if run.outcome in ("late", HELD_BACK):
            marks = self._late.setdefault(run.lock_key, {})
            if run.id not in marks:
                marks[run.id] = (run.started_at, run.slot_end, run.outcome)
                self._changed(run.lock_key)
            self._by_key.get(run.lock_key, {}).pop(run.id, None)
            return
        runs = self._by_key.setdefault(run.lock_key, {})
        attempt = Attempt(run.started_at, run.slot_end, run.outcome, run.running, run.ended_at)
        if runs.get(run.id) != attempt:
            runs[run.id] = attempt
            self._changed(run.lock_key)

    def add_event(self, event: ScrapedRun) -> None:
        """A pause, resume or rerun event of the key (``dislock.core.operator_commands``)."""
        assert event.outcome is not None
        found = self._events.setdefault(event.lock_key, {})
        if event.id not in found:
            found[event.id] = Event(event.started_at, event.slot_end, event.outcome)
            self._changed(event.lock_key)

    def take(self, rows: list[ScrapedRun], since: datetime) -> None:
        """History rows as read: events, scheduled runs and marks, and their spans."""
        for run in rows:
            if run.outcome in (PAUSED, RESUMED, RERUN):
                self.add_event(run)
            if run.scheduled and run.started_at >= since:
                self.add(run)
            if run.scheduled:
                self.set_span(run)

    def _drop(self, lock_key: str, found: dict[int, Any], stale: list[int]) -> None:
        for run_id in stale:
            del found[run_id]
        if stale:
            self._changed(lock_key)

    def trim(self, since: datetime) -> None:
        """Forget what no longer bears on the window that begins at ``since``."""
        for by_key in (self._by_key, self._late):
            for lock_key, runs in by_key.items():
                self._drop(lock_key, runs, [run for run, found in runs.items() if found[0] < since])
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
            self._drop(lock_key, events, stale)
        for lock_key, spans in self._spans.items():
            # A span still matters while it reaches into the window.
            stale = [run for run, span in spans.items() if span.end and span.end <= since]
            self._drop(lock_key, spans, stale)

    def of(self, lock_key: str) -> list[tuple[datetime, datetime | None]]:
        return [(run.started_at, run.slot_end) for run in self.attempts_of(lock_key)]

    def attempts_of(self, lock_key: str) -> list[Attempt]:
        return list(self._by_key.get(lock_key, {}).values())

    def late_of(self, lock_key: str, outcome: str = "late") -> set[datetime]:
        """The ends of the slots marked ``outcome`` (``late``, or ``held_back``)."""
        marks = self._late.get(lock_key, {}).values()
        return {end for _, end, marked in marks if end is not None and marked == outcome}

    def marks_of(self, lock_key: str) -> list[tuple[datetime, datetime | None]]:
        """The late marks' starts and slots, which tell where a job's slots begin as its runs do."""
        return [(start, end) for start, end, _ in self._late.get(lock_key, {}).values()]

    def pauses_of(self, lock_key: str) -> list[Pause]:
        return pause_spans(self._events.get(lock_key, {}).values())

    def reruns_of(self, lock_key: str) -> dict[datetime, datetime]:
        return reruns(self._events.get(lock_key, {}).values())

    def judged_by(self, lock_key: str) -> Marks:
        """The key's marks, events and spans, as the slot judgements take them."""
        return Marks(
            late=self.late_of(lock_key),
            held_back=dict.fromkeys(self.late_of(lock_key, HELD_BACK)),
            pauses=self.pauses_of(lock_key),
            spans=self.spans_of(lock_key),
            reruns=self.reruns_of(lock_key),
        )

    def copy(self) -> WindowStarts:
        """A copy that the original's later changes leave alone (the values are immutable)."""
        clone = WindowStarts.__new__(WindowStarts)
        for name, value in vars(self).items():
            if isinstance(value, dict):
                value = {k: dict(v) if isinstance(v, dict) else v for k, v in value.items()}
            setattr(clone, name, value)
        return clone

    def version(self, lock_key: str) -> int:
        return self._versions.get(lock_key, 0)
