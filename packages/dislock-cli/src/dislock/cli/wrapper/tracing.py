"""A trace span for each wrapped run, with ``dislock-cli[otel]`` (docs/tracing.md).

Only when the OpenTelemetry SDK is installed and an ``OTEL_*`` setting asks for
traces (``wanted``): otherwise not one OpenTelemetry module is imported.  The SDK
reads its own settings (endpoint, headers, service name, sampler); the span is a
child of ``TRACEPARENT`` when given, and the command's ``TRACEPARENT`` names it.
Sending it is bounded (``FLUSH_SECONDS``): a dead collector costs at most that
and one warning line, never the job's exit status.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from dislock.cli.wrapper.settings import WrapperSettings
from dislock.core.observing import Value

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span

logger = logging.getLogger("dislock")

ASKED_BY = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
)
"""Settings of which one, set, turns the span on (``OTEL_TRACES_EXPORTER=none`` and
``OTEL_SDK_DISABLED=true`` turn it off)."""

FLUSH_SECONDS = 5.0
"""The longest the wrapper waits, once the command is over, for its span to be sent."""

CONTEXT_VARIABLES = ("TRACEPARENT", "TRACESTATE")
"""W3C trace context in the environment (``BAGGAGE`` passes through untouched)."""

ON_THE_SPAN = frozenset({"slot", "attempt", "fencing_token"})
"""Notes' attributes that are also the run's own."""


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the ``OTEL_*`` settings ask for a trace."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(environ.get(name, "").strip() for name in ASKED_BY)


class RunSpan:
    """The run's span, told the run's notes (``dislock.core.observing``) as events."""

    def __init__(self, provider: TracerProvider, span: Span, exporters: list[SpanExporter]):
        self.provider, self.span, self.exporters = provider, span, exporters
        self.seen: set[str] = set()
        self.replaced = {name: os.environ.get(name) for name in CONTEXT_VARIABLES}

    def note(self, event: str, attributes: dict[str, Value]) -> None:
        self.seen.add(event)
        if event == "error":
            self.span.set_attribute("error.type", attributes["type"])
        named = {f"dislock.{name}": value for name, value in attributes.items()}
        self.span.add_event(f"dislock.{event}", named)
        self.span.set_attributes(
            {f"dislock.{n}": v for n, v in attributes.items() if n in ON_THE_SPAN}
        )

    def ended(self, status: int) -> None:
        """The run is over with ``status``: end the span and send it."""
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.trace import StatusCode

        from dislock.cli.wrapper.textfile import outcome_of

        for name, value in self.replaced.items():  # for a caller running us in-process
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if "error" in self.seen:
            outcome = "error"
        elif "not_acquired" in self.seen:
            outcome = "not_acquired"
        else:
            outcome = outcome_of(status) if "started" in self.seen else "not_started"
        self.span.set_attributes({"dislock.outcome": outcome, "process.exit.code": status})
        if outcome not in ("ok", "not_acquired"):
            self.span.set_status(StatusCode.ERROR, outcome)
        # Added only now: no exporting thread runs (nor is forked) while the command
        # does.  Sent from a thread of its own, waited for a bounded time: the SDK's
        # force_flush ignores its timeout, and an exporter retries up to its own.
        for exporter in self.exporters:
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        failures = _Failures()
        logging.getLogger("opentelemetry").addHandler(failures)
        sender = threading.Thread(target=self.span.end, name="dislock-span", daemon=True)
        sender.start()
        sender.join(FLUSH_SECONDS)
        if sender.is_alive() or failures.seen:
            logger.warning("the trace span of this run could not be sent")


class _Failures(logging.Handler):
    """Whether the SDK or its exporter complained; what it said stays unsaid (its
    lines may quote the collector's answer or a header)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = False

    def emit(self, record: logging.LogRecord) -> None:
        self.seen = True


def run_span(settings: WrapperSettings, environ: Mapping[str, str]) -> RunSpan | None:
    """The run's span, started (and the command's ``TRACEPARENT`` set to it), if
    traces are asked for and ``dislock-cli[otel]`` is installed."""
    if not wanted(environ):
        return None
    # The SDK's own lines are never shown (see _Failures): none reaches stderr either.
    quiet = logging.getLogger("opentelemetry")
    quiet.propagate = False
    quiet.addHandler(logging.NullHandler())
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        logger.info("OTEL_* settings ask for traces, but dislock-cli[otel] is not installed")
        return None
    try:
        exporters = _exporters(environ)
    except Exception as exc:  # a certificate file that is not there, ...: the job still runs
        # Its class only: its text may quote the endpoint, and the credentials in it.
        logger.warning(
            "no trace span for this run (%s): check the OTEL_* settings", type(exc).__name__
        )
        return None
    if not exporters:
        return None
    provider = TracerProvider(resource=Resource.create(), shutdown_on_exit=False)
    propagator = TraceContextTextMapPropagator()
    given = {name.lower(): environ[name] for name in CONTEXT_VARIABLES if name in environ}
    context = settings.context
    span = provider.get_tracer("dislock.cli").start_span(
        context.lock_key,
        context=propagator.extract(given),
        attributes={
            "dislock.key": context.lock_key,
            "dislock.strategy": ",".join(settings.strategies),
            "host.name": socket.gethostname(),
        },
    )
    carrier: dict[str, str] = {}
    propagator.inject(carrier, trace.set_span_in_context(span))
    observer = RunSpan(provider, span, exporters)
    for name in CONTEXT_VARIABLES:
        if name.lower() in carrier:
            os.environ[name] = carrier[name.lower()]
    return observer


def _exporters(environ: Mapping[str, str]) -> list[SpanExporter]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (``otlp`` by default: OTLP over
    HTTP), found as the SDK finds them, by their entry points."""
    from importlib.metadata import entry_points

    found = {point.name: point for point in entry_points(group="opentelemetry_traces_exporter")}
    exporters = []
    for given in (environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(","):
        name = {"otlp": "otlp_proto_http"}.get(given.strip(), given.strip())
        if name not in found:
            logger.warning("OTEL_TRACES_EXPORTER: no span exporter %r is installed", name)
            continue
        exporters.append(found[name].load()())
    return exporters
