"""Metric families (``dislock.cli.run_metrics.Family``) handed to ``prometheus_client``:
the fleet's (``dislockctl serve``) and a host's (the wrapper's textfile)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from dislock.cli.run_metrics import Family


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
