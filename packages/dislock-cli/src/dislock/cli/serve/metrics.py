"""The Prometheus metric families of a fleet snapshot (``metric_families``), and of
the per-host textfile the wrapper writes (``DISLOCK_METRICS_TEXTFILE``: its
records, ``host_families``), as plain ``Family`` data; ``dislock.cli.prometheus``
hands them to ``prometheus_client``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import NamedTuple

from dislock.cli.prometheus import Family
from dislock.cli.runs.envelope import FACTOR, MIN_RUNS, SLOW, WINDOW
from dislock.cli.serve.fleet_status import MISSED_WINDOW, FleetSnapshot, KeyStatus, LastRun
from dislock.cli.shown import OTHER_OUTCOME
from dislock.core.bounds import MAX_KEY_BYTES, clip, escape
from dislock.core.held_back import HELD_BACK
from dislock.core.history import OUTCOMES
from dislock.core.operator_commands import PAUSED, RESUMED

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


def metric_families(snapshot: FleetSnapshot) -> list[Family]:
    """The exposition of a snapshot.  A key without any run has no run metrics
    (a zero timestamp would read as "last succeeded in 1970")."""
    up = Family(
        "dislock_up",
        "gauge",
        "1 if the database answered this scrape, else 0.",
        (),
        (((), 1.0 if snapshot.up else 0.0),),
    )
    held: list[tuple[tuple[str, ...], float]] = []
    paused: list[tuple[tuple[str, ...], float]] = []
    starts: list[tuple[tuple[str, ...], float]] = []
    successes: list[tuple[tuple[str, ...], float]] = []
    durations: list[tuple[tuple[str, ...], float]] = []
    runs: list[tuple[tuple[str, ...], float]] = []
    missed: list[tuple[tuple[str, ...], float]] = []
    covered: list[tuple[tuple[str, ...], float]] = []
    failed: list[tuple[tuple[str, ...], float]] = []
    late: list[tuple[tuple[str, ...], float]] = []
    paused_slots: list[tuple[tuple[str, ...], float]] = []
    past_envelope: list[tuple[tuple[str, ...], float]] = []
    for key in snapshot.keys:
        name = key_label(key.lock_key)
        # One sample per mode: an N-holder lease has a row per slot, and counts its held ones.
        modes: dict[str, float] = {}
        for lock in key.locks:
            modes[lock.mode] = modes.get(lock.mode, 0.0) + (1.0 if lock.state == "held" else 0.0)
        held.extend(((name, mode), count) for mode, count in modes.items())
        paused.append(((name,), 1.0 if key.paused_until is not None else 0.0))
        if key.last_run is not None:
            starts.append(((name,), key.last_run.started_at.timestamp()))
            if key.last_run.duration_seconds is not None:
                durations.append(((name,), key.last_run.duration_seconds))
            if key.last_run.envelope is not None:
                past = key.last_run.outcome == "running" and key.last_run.mark == SLOW
                past_envelope.append(((name,), 1.0 if past else 0.0))
        success = _timestamp(key.last_success_at)
        if success is not None:
            successes.append(((name,), success))
        if key.last_run is not None or key.runs_total:
            outcomes = dict.fromkeys(RUN_OUTCOMES, 0)
            for outcome, count in key.runs_total.items():
                if outcome in PAUSE_EVENTS:
                    continue
                label = outcome_label(outcome)
                outcomes[label] = outcomes.get(label, 0) + count
            runs.extend(
                ((name, outcome), float(count)) for outcome, count in sorted(outcomes.items())
            )
        if key.missed_slots is not None:
            missed.append(((name,), float(key.missed_slots)))
        if key.covered_slots is not None:
            covered.append(((name,), float(key.covered_slots)))
        if key.failed_slots is not None:
            failed.append(((name,), float(key.failed_slots)))
        if key.late_slots is not None:
            late.append(((name,), float(key.late_slots)))
        if key.paused_slots is not None:
            paused_slots.append(((name,), float(key.paused_slots)))
    window = int(MISSED_WINDOW.total_seconds() // 3600)
    delay = Family(
        "dislock_lock_delay_end_timestamp_seconds",
        "gauge",
        "While a lock delay after a database failover runs, when it ends: no lock of any"
        " key is taken before. 0 when none runs.",
        (),
        (((), _timestamp(snapshot.lock_delay_end) or 0.0),) if snapshot.up else (),
    )
    loopholes = Family(
        "dislock_grant_loopholes",
        "gauge",
        "How many roles can get around the lock table's grants (table-wide privileges,"
        " MAINTAIN, membership in the owner, BYPASSRLS): dislockctl grants lists them.",
        (),
        (((), float(snapshot.grant_loopholes)),) if snapshot.up else (),
    )
    return [
        up,
        delay,
        loopholes,
        _group_held(snapshot),
        Family(
            "dislock_lock_held",
            "gauge",
            "1 while the key's lock of this mode is held, 0 once released or expired"
            " (an N-holder lease: how many of its slots are held).",
            ("key", "mode"),
            tuple(held),
        ),
        Family(
            "dislock_paused",
            "gauge",
            "1 while the key is paused fleet-wide.",
            ("key",),
            tuple(paused),
        ),
        Family(
            "dislock_last_start_timestamp_seconds",
            "gauge",
            "When the key's latest recorded run started (database clock).",
            ("key",),
            tuple(starts),
        ),
        Family(
            "dislock_last_success_timestamp_seconds",
            "gauge",
            "When the key's latest successful run (exit 0) ended (database clock).",
            ("key",),
            tuple(successes),
        ),
        Family(
            "dislock_last_run_duration_seconds",
            "gauge",
            "How long the key's latest run took (so far, while it runs).",
            ("key",),
            tuple(durations),
        ),
        Family(
            "dislock_running_past_envelope",
            "gauge",
            f"1 while the key's latest run is still going and has run longer than {FACTOR:g} x"
            f" the median and the longest of the key's last {WINDOW} successful runs before it"
            f" (keys with at least {MIN_RUNS} of them).",
            ("key",),
            tuple(past_envelope),
        ),
        Family(
            "dislock_runs",
            "counter",
            "Recorded runs of the key by outcome, over the history the table keeps.",
            ("key", "outcome"),
            tuple(runs),
        ),
        Family(
            "dislock_missed_slots",
            "gauge",
            f"Schedule slots that began in the last {window} h in which no run of the key"
            " started and none was still going (late ones included; paused ones not).",
            ("key",),
            tuple(missed),
        ),
        Family(
            "dislock_failed_slots",
            "gauge",
            f"Schedule slots that began in the last {window} h and are over, in which every"
            " attempt of the key failed (its retries used up, or none asked for).",
            ("key",),
            tuple(failed),
        ),
        Family(
            "dislock_late_slots",
            "gauge",
            f"Schedule slots that began in the last {window} h that nobody started before"
            " their start deadline (LOCK_START_DEADLINE_SECONDS).",
            ("key",),
            tuple(late),
        ),
        Family(
            "dislock_paused_slots",
            "gauge",
            f"Schedule slots that began in the last {window} h without a start while a"
            " dislockctl pause of the key was in force (not missed).",
            ("key",),
            tuple(paused_slots),
        ),
        Family(
            "dislock_covered_slots",
            "gauge",
            f"Schedule slots that began in the last {window} h without a start of the key"
            " because a run of it still held the lease (a run longer than its interval).",
            ("key",),
            tuple(covered),
        ),
    ]


def _group_held(snapshot: FleetSnapshot) -> Family:
    """``dislock_group_held``: one sample per group of ``snapshot.groups``."""
    window = int(MISSED_WINDOW.total_seconds() // 3600)
    return Family(
        "dislock_group_held",
        "gauge",
        "How many slots of the group (LOCK_GROUP=NAME:N) are held; its N is each member's"
        f" own setting, in no row. Groups with a slot held or ended in the last {window} h.",
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
    keys = tuple(
        KeyStatus(
            key,
            last_run=LastRun(
                "",
                "",
                epoch + timedelta(seconds=record.last_start),
                None,
                "",
                None,
                record.last_duration,
            ),
            last_success_at=(
                None
                if record.last_success is None
                else epoch + timedelta(seconds=record.last_success)
            ),
            runs_total=record.runs,
        )
        for key, record in sorted(records.items())
    )
    return [
        family
        for family in metric_families(FleetSnapshot(epoch, up=True, keys=keys))
        if family.name in HOST_FAMILIES
    ]
