"""A lock key's runs as plain metric families (``Family``, independent of any
Prometheus library): the four a host can know alone (``run_families``), which
``dislockctl serve`` exposes and the wrapper writes to a node_exporter textfile
(``DISLOCK_METRICS_TEXTFILE``: ``host_families``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from dislock.cli.shown import OTHER_OUTCOME
from dislock.core.after import HELD_BACK
from dislock.core.bounds import MAX_KEY_BYTES, clip, escape
from dislock.core.history import OUTCOMES
from dislock.core.operator_commands import PAUSED, RESUMED

Sample = tuple[tuple[str, ...], float]


class Family(NamedTuple):
    """One metric family, independent of any Prometheus library."""

    name: str
    kind: str
    """``gauge`` or ``counter`` (named without its ``_total`` suffix)."""
    documentation: str
    labels: tuple[str, ...]
    samples: tuple[Sample, ...]


PAUSE_EVENTS = (PAUSED, RESUMED, HELD_BACK)
"""History rows that are no runs, and not counted as any."""

RUN_OUTCOMES = tuple(outcome for outcome in OUTCOMES if outcome not in PAUSE_EVENTS)
"""Finished outcomes ``dislock_runs_total`` always reports (zero if none), so that
``increase()`` sees a key's first failure."""


def key_label(key: str) -> str:
    """A lock key as a label value: as it is if it could be a lock key (every key dislock
    takes); else escaped and clipped, followed by the first 8 hex digits of its
    SHA-256, so that two such keys stay two series (a duplicate series would make
    Prometheus refuse the whole scrape)."""
    if escape(key) == key and len(key.encode()) <= MAX_KEY_BYTES:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"{clip(key)} ({digest})"


def outcome_label(outcome: str) -> str:
    """A recorded outcome as a label value: dislock's own, else ``other`` (a label value
    must neither carry what anyone wrote nor multiply series)."""
    return outcome if outcome in RUN_OUTCOMES else OTHER_OUTCOME


_RUN_FAMILIES = (
    (
        "dislock_last_start_timestamp_seconds",
        "gauge",
        "When the key's latest recorded run started (database clock).",
        ("key",),
    ),
    (
        "dislock_last_success_timestamp_seconds",
        "gauge",
        "When the key's latest successful run (exit 0) ended (database clock).",
        ("key",),
    ),
    (
        "dislock_last_run_duration_seconds",
        "gauge",
        "How long the key's latest run took (so far, while it runs).",
        ("key",),
    ),
    (
        "dislock_runs",
        "counter",
        "Recorded runs of the key by outcome, over the history the table keeps.",
        ("key", "outcome"),
    ),
)

HOST_FAMILIES = tuple(name for name, *_ in _RUN_FAMILIES)
"""The families a host's file holds: its own runs only (the rest is ``serve``'s)."""


class RunRecord(NamedTuple):
    """One lock key's runs: its latest, its latest success and how many ended in each
    outcome (times in seconds since the epoch)."""

    last_start: float | None
    last_duration: float | None
    last_success: float | None
    runs: Mapping[str, int]


def run_families(records: Iterable[tuple[str, RunRecord]]) -> list[Family]:
    """The families of ``HOST_FAMILIES``, in that order.  A key without any run has
    no run metrics (a zero timestamp would read as "last succeeded in 1970")."""
    starts: list[Sample] = []
    successes: list[Sample] = []
    durations: list[Sample] = []
    runs: list[Sample] = []
    for key, record in records:
        name = (key_label(key),)
        if record.last_start is not None:
            starts.append((name, record.last_start))
        if record.last_duration is not None:
            durations.append((name, record.last_duration))
        if record.last_success is not None:
            successes.append((name, record.last_success))
        if record.last_start is not None or record.runs:
            outcomes = dict.fromkeys(RUN_OUTCOMES, 0)
            for outcome, count in record.runs.items():
                if outcome not in PAUSE_EVENTS:
                    outcomes[outcome_label(outcome)] = (
                        outcomes.get(outcome_label(outcome), 0) + count
                    )
            runs.extend(((*name, outcome), float(n)) for outcome, n in sorted(outcomes.items()))
    found = (starts, successes, durations, runs)
    return [
        Family(*spec, tuple(samples)) for spec, samples in zip(_RUN_FAMILIES, found, strict=True)
    ]


def read_host_records(
    samples: Iterable[tuple[str, Mapping[str, str], float]],
) -> dict[str, RunRecord]:
    """The records in a textfile, from its samples; samples this version did not write are
    dropped."""
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
        records[key] = RunRecord(
            found["dislock_last_start_timestamp_seconds"],
            found.get("dislock_last_run_duration_seconds", 0.0),
            found.get("dislock_last_success_timestamp_seconds"),
            runs.get(key, {}),
        )
    return records


def record_run(
    records: Mapping[str, RunRecord], lock_key: str, started: float, ended: float, outcome: str
) -> dict[str, RunRecord]:
    """``records`` with one more run of ``lock_key`` (times in seconds since the epoch)."""
    previous = records.get(lock_key)
    runs = dict(previous.runs) if previous else {}
    runs[outcome] = runs.get(outcome, 0) + 1
    success = ended if outcome == "ok" else (previous.last_success if previous else None)
    return {**records, lock_key: RunRecord(started, max(0.0, ended - started), success, runs)}


def host_families(records: Mapping[str, RunRecord]) -> list[Family]:
    """The textfile's families: the run families of the host's own keys."""
    return run_families(sorted(records.items()))
