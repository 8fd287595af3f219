"""A lock key's runs as plain metric families (``Family``): the four a host can know
alone (``run_families``), which ``dislockctl serve`` exposes and the wrapper writes to a
node_exporter textfile (``DISLOCK_METRICS_TEXTFILE``: ``host_families``); and their
hand-over to ``prometheus_client`` (``Families``, ``Exposition``).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

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


_RUN_GAUGES = {
    "dislock_last_start_timestamp_seconds": "When the key's latest recorded run started"
    " (database clock).",
    "dislock_last_success_timestamp_seconds": "When the key's latest successful run (exit 0)"
    " ended (database clock).",
    "dislock_last_run_duration_seconds": "How long the key's latest run took (so far, while"
    " it runs).",
}

_RUNS_HELP = "Recorded runs of the key by outcome, over the history the table keeps."

HOST_FAMILIES = (*_RUN_GAUGES, "dislock_runs")
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
    found: list[list[Sample]] = [[], [], [], []]
    starts, successes, durations, runs = found
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
                    label = outcome_label(outcome)
                    outcomes[label] = outcomes.get(label, 0) + count
            runs.extend(((*name, outcome), float(n)) for outcome, n in sorted(outcomes.items()))
    gauges = zip(_RUN_GAUGES.items(), (starts, successes, durations), strict=True)
    return [
        *(Family(name, "gauge", text, ("key",), tuple(values)) for (name, text), values in gauges),
        Family("dislock_runs", "counter", _RUNS_HELP, ("key", "outcome"), tuple(runs)),
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
    return {
        key: RunRecord(
            found["dislock_last_start_timestamp_seconds"],
            found.get("dislock_last_run_duration_seconds", 0.0),
            found.get("dislock_last_success_timestamp_seconds"),
            runs.get(key, {}),
        )
        for key, found in values.items()
        if "dislock_last_start_timestamp_seconds" in found
    }


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


class Families(Collector):
    """Collects what ``produce`` returns, anew at each collection (each scrape)."""

    def __init__(self, produce: Callable[[], list[Family]]) -> None:
        self._produce = produce

    def collect(self) -> Iterator[Metric]:
        for family in self._produce():
            kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            metric = kind(family.name, family.documentation, labels=family.labels)
            for labels, value in family.samples:
                metric.add_metric(list(labels), value)
            yield metric


CHUNK = 100
"""Samples rendered together: a scrape renders anew only the chunks that changed."""


class Exposition:
    """The text exposition of families, rendered by ``prometheus_client`` in chunks of
    samples, each kept while its samples stay the same: rendering a thousand keys'
    samples costs about as much as reading the snapshot, while between two scrapes only
    the few keys that ran change.  Only a family's first chunk has the ``# HELP`` and
    ``# TYPE`` lines.
    """

    def __init__(self) -> None:
        self._rendered: dict[tuple[str, int], tuple[Family, bytes]] = {}
        self._lock = threading.Lock()

    def __call__(self, families: Sequence[Family]) -> bytes:
        parts = []
        for family in families:
            starts = range(0, max(1, len(family.samples)), CHUNK)
            for index, start in enumerate(starts):
                chunk = family._replace(samples=family.samples[start : start + CHUNK])
                with self._lock:
                    found = self._rendered.get((family.name, index))
                if found is None or found[0] != chunk:
                    found = (chunk, self._render(chunk, header=index == 0))
                    with self._lock:
                        self._rendered[family.name, index] = found
                parts.append(found[1])
        return b"".join(parts)

    @staticmethod
    def _render(family: Family, *, header: bool) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(Families([family].copy))
        text = generate_latest(registry)
        if header:
            return text
        return b"".join(
            line for line in text.splitlines(keepends=True) if not line.startswith(b"# ")
        )
