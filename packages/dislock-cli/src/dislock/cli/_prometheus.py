"""``dislock.core.exporter``'s metric families, handed to ``prometheus_client``."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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
