"""The schedule slots ``dislockctl serve`` counts missed slots in, computed within bounds.

Any machine that writes the run history chooses the cron expression and zone
recorded with a run, so a key's latest reading is input nobody vetted: a per-second
schedule is 86,400 boundaries over the window.  ``ScheduleWindows`` keeps each key's
slots from one scrape to the next and bounds what any scrape computes (the limits
below; docs/operator.md lists the rules).  A reading not counted has no
``dislock_missed_slots`` sample: no count rather than a wrong one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo
from typing import NamedTuple

from dislock.cli.runs.missed_slots import DEFAULT_GRACE, Slot
from dislock.core.cron import next_boundary
from dislock.core.cron_zone import recorded_zone
from dislock.core.errors import ConfigurationError

MAX_WINDOW_SLOTS = 3000
"""Slots of one reading in the window that ``serve`` counts at most (every 30 s)."""

MAX_READINGS_PER_KEY = 4
"""(cron expression, zone) readings of one key kept at once."""

MAX_CRON_LENGTH = 128
"""Characters of a cron expression ``serve`` reads at most: each boundary parses the
expression again, at a cost that grows with its length."""

SCRAPE_BOUNDARY_BUDGET = 3000
"""Cron boundaries one scrape computes at most, over every key: 0.5 to 2 ms each on a
busy two-core machine."""

TURN = 250
"""Boundaries a reading computes per turn when several wait: one reading that will
never catch up does not hold back the others."""

_TICK = timedelta(microseconds=1)


class KeyWindow(NamedTuple):
    """What one scrape knows of a key's schedule."""

    slots: list[Slot] | None
    """The slots that began in the window, back to back; None when not counted."""
    version: int
    """Changes whenever ``slots`` do."""
    next_slot: datetime | None


class Scrape(NamedTuple):
    windows: dict[str, KeyWindow]
    notes: list[str]
    """Reasons told for the first time, one line each, for the log."""
    boundaries: int
    """Cron boundaries this scrape computed."""


@dataclass(eq=False)
class _Reading:
    cron: str
    tz: tzinfo | None
    """None: the reading cannot be read (``problem`` says why)."""
    problem: str = ""
    slots: list[Slot] = field(default_factory=list)
    start: datetime | None = None
    """Where the next slot begins, once known; slots are back to back."""
    search_from: datetime | None = None
    """Until ``start`` is known: the next slot is the first to begin at or after this."""
    version: int = 0
    next_slot: datetime | None = None
    too_dense: bool = False
    waiting_since: int = 0
    """The scrape from which it has been behind."""

    def behind(self, now: datetime) -> bool:
        return self.start is None or self.start + DEFAULT_GRACE <= now


def _short(text: str) -> str:
    """``text`` quoted with its control characters escaped, cut at 64 characters."""
    return repr(text if len(text) <= 64 else text[:64] + "...")


class ScheduleWindows:
    """Each key's readings and their slots, kept across scrapes.  Not thread-safe:
    ``serve`` calls ``scrape`` under a lock of its own."""

    def __init__(
        self,
        *,
        max_window_slots: int = MAX_WINDOW_SLOTS,
        max_readings: int = MAX_READINGS_PER_KEY,
        budget: int = SCRAPE_BOUNDARY_BUDGET,
    ) -> None:
        self._max_slots = max_window_slots
        self._max_readings = max_readings
        self._budget = budget
        # A reading's slots are shared by every key that reads its schedule so (a fleet
        # of hourly jobs has a few dozen expressions); each key remembers when it last
        # had each of its readings.
        self._readings: dict[tuple[str, str | None], _Reading] = {}
        self._keys: dict[str, dict[tuple[str, str | None], datetime]] = {}
        self._told: dict[str, set[str]] = {}
        self._notes: list[str] = []
        self._scrapes = 0

    def scrape(
        self, schedules: Iterable[tuple[str, str, str | None]], since: datetime, now: datetime
    ) -> Scrape:
        """The windows of ``schedules`` (lock key, cron expression, recorded zone or None for
        UTC) between ``since`` and ``now``."""
        self._scrapes += 1
        self._notes = []
        schedules = sorted(schedules, key=lambda found: found[0])
        latest: dict[str, _Reading] = {}
        for key, cron, zone in schedules:
            reading = self._reading(key, cron, zone, since, now)
            if reading is not None:
                latest[key] = reading
        for gone in set(self._keys) - {key for key, _, _ in schedules}:
            del self._keys[gone]
            self._told.pop(gone, None)
        kept = {name for seen in self._keys.values() for name in seen}
        for name in set(self._readings) - kept:
            del self._readings[name]
        unique = list({id(reading): reading for reading in latest.values()}.values())

        budget = self._budget
        # The next slots first: one boundary each, and every key with a schedule shows one.
        for reading in unique:
            if reading.tz is None or budget <= 0:
                continue
            if reading.next_slot is None or reading.next_slot <= now:
                reading.next_slot = None
                budget -= 1
                try:
                    reading.next_slot = next_boundary(reading.cron, now, reading.tz)
                except (ConfigurationError, ValueError) as exc:
                    reading.tz, reading.problem = None, f"its cron expression: {exc}"
        behind = []
        for reading in unique:
            if reading.tz is not None and not reading.too_dense:
                self._trim(reading, since)
                if reading.behind(now):
                    behind.append(reading)
                else:
                    reading.waiting_since = self._scrapes
        behind.sort(key=lambda reading: reading.waiting_since)
        while behind and budget > 0:
            for reading in list(behind):
                budget -= self._advance(reading, now, min(TURN, budget))
                if not reading.behind(now) or reading.too_dense or reading.tz is None:
                    reading.waiting_since = self._scrapes
                    behind.remove(reading)
                if budget <= 0:
                    break

        windows = {}
        for key, reading in latest.items():
            if reading.tz is None:
                self._tell(key, "invalid", f"{reading.problem}; its missed slots are not counted")
                windows[key] = KeyWindow(None, reading.version, None)
                continue
            if reading.too_dense:
                self._tell(
                    key,
                    "dense",
                    f"its schedule {_short(reading.cron)} has more than {self._max_slots:,}"
                    " slots in the window; serve does not count its missed slots"
                    " (dislockctl missed does)",
                )
            counted = not reading.too_dense and not reading.behind(now)
            windows[key] = KeyWindow(
                reading.slots if counted else None, reading.version, reading.next_slot
            )
        return Scrape(windows, self._notes, self._budget - budget)

    def _tell(self, key: str, reason: str, text: str) -> None:
        told = self._told.setdefault(key, set())
        if reason not in told:
            told.add(reason)
            self._notes.append(f"lock key {_short(key)}: {text}")

    def _reading(
        self, key: str, cron: str, zone: str | None, since: datetime, now: datetime
    ) -> _Reading | None:
        """The key's reading (cron, zone), kept or new; None when the key has too many."""
        seen = self._keys.setdefault(key, {})
        for name in [name for name, when in seen.items() if when < since]:
            del seen[name]  # not the key's latest for a whole window
        if (cron, zone) not in seen and len(seen) >= self._max_readings:
            self._tell(
                key,
                "readings",
                f"its runs recorded more than {self._max_readings} schedules"
                " (cron expression and zone) within the window; its missed slots are"
                " not counted until the older ones are a window old",
            )
            return None
        seen[cron, zone] = now
        if (cron, zone) not in self._readings:
            self._readings[cron, zone] = self._new_reading(cron, zone, since)
        return self._readings[cron, zone]

    def _new_reading(self, cron: str, zone: str | None, since: datetime) -> _Reading:
        if len(cron) > MAX_CRON_LENGTH:
            problem = f"its cron expression is longer than {MAX_CRON_LENGTH} characters"
            return _Reading(cron, None, problem=problem)
        try:
            tz = timezone.utc if zone is None else recorded_zone(zone)
        except ConfigurationError as exc:
            return _Reading(cron, None, problem=str(exc))
        return _Reading(cron, tz, search_from=since, waiting_since=self._scrapes)

    def _trim(self, reading: _Reading, since: datetime) -> None:
        """Forget the slots that began before the window."""
        kept = [slot for slot in reading.slots if slot.start >= since]
        if len(kept) != len(reading.slots):
            reading.slots = kept
            reading.version += 1
        if reading.start is not None and reading.start < since and not kept:
            # It fell behind the window itself: start again from the window's start.
            reading.start, reading.search_from = None, since
        elif reading.start is None and reading.search_from is not None:
            reading.search_from = max(reading.search_from, since)

    def _advance(self, reading: _Reading, now: datetime, budget: int) -> int:
        """Compute up to ``budget`` boundaries of ``reading``'s slots; how many it did."""
        assert reading.tz is not None
        used = 0
        try:
            if reading.start is None:
                assert reading.search_from is not None
                reading.start = next_boundary(reading.cron, reading.search_from - _TICK, reading.tz)
                used += 1
            added = False
            while used < budget and reading.start + DEFAULT_GRACE <= now:
                end = next_boundary(reading.cron, reading.start, reading.tz)
                used += 1
                reading.slots.append(Slot(reading.start, end))
                reading.start = end
                added = True
                if len(reading.slots) > self._max_slots:
                    reading.too_dense, reading.slots = True, []
                    break
            if added:
                reading.version += 1
        except (ConfigurationError, ValueError) as exc:
            reading.tz, reading.problem = None, f"its cron expression: {exc}"
            reading.slots = []
        return max(used, 1)
