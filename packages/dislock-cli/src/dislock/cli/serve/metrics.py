"""The Prometheus metric families of a fleet snapshot (``metric_families``), and of
the per-host textfile the wrapper writes (``DISLOCK_METRICS_TEXTFILE``: its
records, ``host_families``).  Plain data, independent of any Prometheus library:
``dislock.cli.serve._prometheus`` hands them to ``prometheus_client``, which only the
CLI depends on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import NamedTuple

from dislock.cli.runs.envelope import FACTOR, MIN_RUNS, SLOW, WINDOW
from dislock.cli.serve.fleet_status import MISSED_WINDOW, FleetSnapshot, KeyStatus, LastRun
from dislock.cli.shown import OTHER_OUTCOME
from dislock.core.bounds import MAX_KEY_BYTES, clip, escape
from dislock.core.events import PAUSED, RESUMED
from dislock.core.held_back import HELD_BACK
from dislock.core.history import OUTCOMES


class Family(NamedTuple):
    """One metric family, independent of any Prometheus library."""

    name: str
    kind: str
    """``gauge`` or ``counter`` (named without its ``_total`` suffix)."""
    documentation: str
    labels: tuple[str, ...]
    samples: tuple[tuple[tuple[str, ...], float], ...]


PAUSE_EVENTS = (PAUSED, RESUMED, HELD_BACK)
"""History rows of ``dislockctl pause`` and ``resume``, and of a slot held back by
``LOCK_AFTER``: no runs, and not counted as any (``dislock_paused``,
``dislock_paused_slots`` and ``dislock_missed_slots`` tell of them)."""

RUN_OUTCOMES = tuple(outcome for outcome in OUTCOMES if outcome not in PAUSE_EVENTS)
"""Finished outcomes ``dislock_runs_total`` always reports (zero if none), so that
``increase()`` sees a key's first failure."""


def key_label(key: str) -> str:
    """A lock key as a label value: as it is, if it could be a lock key (at most
    ``MAX_KEY_BYTES``, no control or invisible characters: every key dislock takes);
    else escaped and clipped (``clip``), followed by the first 8 hex digits of its
    SHA-256, so that two such keys stay two series (a duplicate series would make
    Prometheus refuse the whole scrape)."""
    if escape(key) == key and len(key.encode()) <= MAX_KEY_BYTES:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"{clip(key)} ({digest})"


def outcome_label(outcome: str) -> str:
    """A recorded outcome as a label value: dislock's own, else ``other`` (written by
    hand: a label value must neither carry what anyone wrote nor multiply series)."""
    return outcome if outcome in RUN_OUTCOMES else OTHER_OUTCOME


def _timestamp(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


Sample = tuple[tuple[str, ...], float]
Samples = Callable[[KeyStatus, str], Iterable[Sample]]
"""A per-key family's samples of one key, given its label (``key_label``)."""

_WINDOW_HOURS = int(MISSED_WINDOW.total_seconds() // 3600)


def _one(value: Callable[[KeyStatus], float | None]) -> Samples:
    """A family with one sample per key, labelled by the key alone; none when ``value``
    is None (a key without any run has no run metrics: a zero timestamp would read as
    "last succeeded in 1970")."""

    def samples(key: KeyStatus, label: str) -> Iterable[Sample]:
        found = value(key)
        return () if found is None else (((label,), found),)

    return samples


def _slots(field: str) -> Samples:
    """The count of a slot state (``KeyStatus.missed_slots``, …), for keys with a schedule."""
    return _one(lambda key: None if getattr(key, field) is None else float(getattr(key, field)))


def _held(key: KeyStatus, label: str) -> Iterable[Sample]:
    # One sample per mode: an N-holder lease has a row per slot, and counts its held ones.
    modes: dict[str, float] = {}
    for lock in key.locks:
        modes[lock.mode] = modes.get(lock.mode, 0.0) + (1.0 if lock.state == "held" else 0.0)
    return (((label, mode), count) for mode, count in modes.items())


def _past_envelope(key: KeyStatus) -> float | None:
    run = key.last_run
    if run is None or run.envelope is None:
        return None
    return 1.0 if run.outcome == "running" and run.mark == SLOW else 0.0


def _runs(key: KeyStatus, label: str) -> Iterable[Sample]:
    if key.last_run is None and not key.runs_total:
        return ()
    outcomes = dict.fromkeys(RUN_OUTCOMES, 0)
    for outcome, count in key.runs_total.items():
        if outcome not in PAUSE_EVENTS:
            outcomes[outcome_label(outcome)] = outcomes.get(outcome_label(outcome), 0) + count
    return (((label, outcome), float(count)) for outcome, count in sorted(outcomes.items()))


class _PerKey(NamedTuple):
    name: str
    documentation: str
    samples: Samples
    labels: tuple[str, ...] = ("key",)
    kind: str = "gauge"


_PER_KEY = (
    _PerKey(
        "dislock_lock_held",
        "1 while the key's lock of this mode is held, 0 once released or expired"
        " (an N-holder lease: how many of its slots are held).",
        _held,
        labels=("key", "mode"),
    ),
    _PerKey(
        "dislock_paused",
        "1 while the key is paused fleet-wide.",
        _one(lambda key: 1.0 if key.paused_until is not None else 0.0),
    ),
    _PerKey(
        "dislock_last_start_timestamp_seconds",
        "When the key's latest recorded run started (database clock).",
        _one(lambda key: key.last_run and key.last_run.started_at.timestamp()),
    ),
    _PerKey(
        "dislock_last_success_timestamp_seconds",
        "When the key's latest successful run (exit 0) ended (database clock).",
        _one(lambda key: _timestamp(key.last_success_at)),
    ),
    _PerKey(
        "dislock_last_run_duration_seconds",
        "How long the key's latest run took (so far, while it runs).",
        _one(lambda key: key.last_run and key.last_run.duration_seconds),
    ),
    _PerKey(
        "dislock_running_past_envelope",
        f"1 while the key's latest run is still going and has run longer than {FACTOR:g} x"
        f" the median and the longest of the key's last {WINDOW} successful runs before it"
        f" (keys with at least {MIN_RUNS} of them).",
        _one(_past_envelope),
    ),
    _PerKey(
        "dislock_runs",
        "Recorded runs of the key by outcome, over the history the table keeps.",
        _runs,
        labels=("key", "outcome"),
        kind="counter",
    ),
    _PerKey(
        "dislock_missed_slots",
        f"Schedule slots that began in the last {_WINDOW_HOURS} h in which no run of the key"
        " started and none was still going (late ones included; paused ones not).",
        _slots("missed_slots"),
    ),
    _PerKey(
        "dislock_failed_slots",
        f"Schedule slots that began in the last {_WINDOW_HOURS} h and are over, in which every"
        " attempt of the key failed (its retries used up, or none asked for).",
        _slots("failed_slots"),
    ),
    _PerKey(
        "dislock_late_slots",
        f"Schedule slots that began in the last {_WINDOW_HOURS} h that nobody started before"
        " their start deadline (LOCK_START_DEADLINE_SECONDS).",
        _slots("late_slots"),
    ),
    _PerKey(
        "dislock_paused_slots",
        f"Schedule slots that began in the last {_WINDOW_HOURS} h without a start while a"
        " dislockctl pause of the key was in force (not missed).",
        _slots("paused_slots"),
    ),
    _PerKey(
        "dislock_covered_slots",
        f"Schedule slots that began in the last {_WINDOW_HOURS} h without a start of the key"
        " because a run of it still held the lease (a run longer than its interval).",
        _slots("covered_slots"),
    ),
)


def metric_families(snapshot: FleetSnapshot) -> list[Family]:
    """The exposition of a snapshot: the fleet's families, then one per ``_PER_KEY``."""
    labelled = [(key, key_label(key.lock_key)) for key in snapshot.keys]
    per_key = [
        Family(name, kind, text, labels, tuple(s for key, at in labelled for s in samples(key, at)))
        for name, text, samples, labels, kind in _PER_KEY
    ]
    return [*_fleet_families(snapshot), _group_held(snapshot), *per_key]


def _fleet_families(snapshot: FleetSnapshot) -> list[Family]:
    """The samples without labels: whether the database answered, and what it says of
    the whole table (none when it did not answer)."""
    answered = snapshot.up
    return [
        Family(
            "dislock_up",
            "gauge",
            "1 if the database answered this scrape, else 0.",
            (),
            (((), 1.0 if answered else 0.0),),
        ),
        Family(
            "dislock_lock_delay_end_timestamp_seconds",
            "gauge",
            "While a lock delay after a database failover runs, when it ends: no lock of any"
            " key is taken before. 0 when none runs.",
            (),
            (((), _timestamp(snapshot.lock_delay_end) or 0.0),) if answered else (),
        ),
        Family(
            "dislock_grant_loopholes",
            "gauge",
            "How many roles can get around the lock table's grants (table-wide privileges,"
            " MAINTAIN, membership in the owner, BYPASSRLS): dislockctl grants lists them.",
            (),
            (((), float(snapshot.grant_loopholes)),) if answered else (),
        ),
    ]


def _group_held(snapshot: FleetSnapshot) -> Family:
    """``dislock_group_held``: one sample per group of ``snapshot.groups``."""
    return Family(
        "dislock_group_held",
        "gauge",
        "How many slots of the group (LOCK_GROUP=NAME:N) are held; its N is each member's"
        f" own setting, in no row. Groups with a slot held or ended in the last {_WINDOW_HOURS} h.",
        ("group",),
        tuple(((key_label(group.name),), float(group.held)) for group in snapshot.groups),
    )


HOST_FAMILIES = (
    "dislock_last_start_timestamp_seconds",
    "dislock_last_success_timestamp_seconds",
    "dislock_last_run_duration_seconds",
    "dislock_runs",
)
"""The families a host's file holds: its own runs only (held locks, pauses and
missed slots are fleet-wide facts, for ``serve``)."""


class HostRecord(NamedTuple):
    """One lock key's runs on this host, as its textfile keeps them."""

    last_start: float
    last_duration: float
    last_success: float | None
    runs: Mapping[str, int]


def read_host_records(
    samples: Iterable[tuple[str, Mapping[str, str], float]],
) -> dict[str, HostRecord]:
    """The records in a textfile, from its samples ``(name, labels, value)``; samples
    this version did not write are left out (and so dropped on the next write)."""
    values: dict[str, dict[str, float]] = {}
    runs: dict[str, dict[str, int]] = {}
    for name, labels, value in samples:
        key = labels.get("key")
        if key is None:
            continue
        if name == "dislock_runs_total" and "outcome" in labels:
            runs.setdefault(key, {})[labels["outcome"]] = int(value)
        elif name in HOST_FAMILIES:
            values.setdefault(key, {})[name] = value
    records = {}
    for key, found in values.items():
        if "dislock_last_start_timestamp_seconds" not in found:
            continue
        records[key] = HostRecord(
            found["dislock_last_start_timestamp_seconds"],
            found.get("dislock_last_run_duration_seconds", 0.0),
            found.get("dislock_last_success_timestamp_seconds"),
            runs.get(key, {}),
        )
    return records


def record_run(
    records: Mapping[str, HostRecord], lock_key: str, started: float, ended: float, outcome: str
) -> dict[str, HostRecord]:
    """``records`` with one more run of ``lock_key`` (times in seconds since the epoch)."""
    previous = records.get(lock_key)
    runs = dict(previous.runs) if previous else {}
    runs[outcome] = runs.get(outcome, 0) + 1
    success = ended if outcome == "ok" else (previous.last_success if previous else None)
    return {**records, lock_key: HostRecord(started, max(0.0, ended - started), success, runs)}


def host_families(records: Mapping[str, HostRecord]) -> list[Family]:
    """The textfile's families: those of ``metric_families`` a host can know alone."""
    epoch = datetime.fromtimestamp(0, tz=timezone.utc)

    def status(key: str, record: HostRecord) -> KeyStatus:
        started = epoch + timedelta(seconds=record.last_start)
        run = LastRun("", "", started, None, "", None, record.last_duration)
        success = record.last_success
        ended = None if success is None else epoch + timedelta(seconds=success)
        return KeyStatus(key, last_run=run, last_success_at=ended, runs_total=record.runs)

    keys = tuple(status(key, record) for key, record in sorted(records.items()))
    families = metric_families(FleetSnapshot(epoch, up=True, keys=keys))
    return [family for family in families if family.name in HOST_FAMILIES]
