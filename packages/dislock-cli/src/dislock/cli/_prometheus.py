"""``dislock.core.exporter``'s metric families, handed to ``prometheus_client``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from dislock.core.exporter import Family


def prometheus_metric(family: Family) -> Metric:
    """A ``Family`` as ``prometheus_client`` exposes it."""
    metric: GaugeMetricFamily | CounterMetricFamily
    if family.kind == "counter":
        metric = CounterMetricFamily(family.name, family.documentation, labels=family.labels)
    else:
        metric = GaugeMetricFamily(family.name, family.documentation, labels=family.labels)
    for labels, value in family.samples:
        metric.add_metric(list(labels), value)
    return metric


class Families(Collector):
    """Collects what ``produce`` returns, anew at each collection (each scrape)."""

    def __init__(self, produce: Callable[[], list[Family]]) -> None:
        self._produce = produce

    def collect(self) -> Iterator[Metric]:
        for family in self._produce():
            yield prometheus_metric(family)


class Exposition:
    """The text exposition of families, each rendered by ``prometheus_client`` and
    kept while its samples stay the same.

    Rendering costs about as much as reading the snapshot (a thousand keys make
    some ten thousand samples) while most families do not change between two
    scrapes: the lock rows, pauses and missed slots rarely do.
    """

    def __init__(self) -> None:
        self._rendered: dict[str, tuple[Family, bytes]] = {}
        self._lock = threading.Lock()

    def __call__(self, families: Sequence[Family]) -> bytes:
        parts = []
        for family in families:
            with self._lock:
                found = self._rendered.get(family.name)
            if found is None or found[0] != family:
                registry = CollectorRegistry(auto_describe=False)
                registry.register(Families([family].copy))
                found = (family, generate_latest(registry))
                with self._lock:
                    self._rendered[family.name] = found
            parts.append(found[1])
        return b"".join(parts)
