"""``dislock-cli[otel]``: each wrapped run is a span, sent by OTLP/HTTP to a collector of
the test's own, and the command's ``TRACEPARENT`` names it; without ``OTEL_*`` settings
(or without the extra) the trace context passes through and nothing OpenTelemetry loads."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from dislock.core.rows import lease_key
from tests.cli.conftest import DISLOCK, Ctl, dislock_on_path, holding, run_pasted
from tests.support.eventually import wait_for
from tests.support.rows import Rows

TRACE_ID, PARENT_ID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
PRINT_CONTEXT = 'echo "$TRACEPARENT|$TRACESTATE|$BAGGAGE|$DISLOCK_FENCING_TOKEN"'
"""A command that prints the trace context it was given (and its fencing token)."""


class Collector:
    """What an OTLP/HTTP collector on 127.0.0.1 received: each POST's path, headers, body."""

    def __init__(self, port: int) -> None:
        self.endpoint = f"http://127.0.0.1:{port}"
        self.posts: list[tuple[str, dict[str, str], bytes]] = []

    def spans(self) -> list[tuple[dict[str, Any], Span]]:
        """Every span received, beside its resource's attributes."""
        found: list[tuple[dict[str, Any], Span]] = []
        for path, _, body in self.posts:
            assert path == "/v1/traces"
            request = ExportTraceServiceRequest.FromString(body)
            for resource_spans in request.resource_spans:
                resource = values(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    found.extend((resource, span) for span in scope_spans.spans)
        return found

    def span(self) -> Span:
        """The one span received."""
        spans = self.spans()
        assert len(spans) == 1, spans
        return spans[0][1]


def values(attributes: Any) -> dict[str, Any]:
    """OTLP key-values as a dict."""
    pairs: list[KeyValue] = list(attributes)
    return {kv.key: getattr(kv.value, str(kv.value.WhichOneof("value"))) for kv in pairs}


def events(span: Span) -> dict[str, list[dict[str, Any]]]:
    """The span's events by name, each its attributes."""
    named: dict[str, list[dict[str, Any]]] = {}
    for event in span.events:
        named.setdefault(event.name, []).append(values(event.attributes))
    return named


@contextlib.contextmanager
def collector() -> Iterator[Collector]:
    received: Collector

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.posts.append((self.path, dict(self.headers), body))
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    received = Collector(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()


def traced(env: dict[str, str], endpoint: str, **more: str) -> dict[str, str]:
    return {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "nightly", **more}


def run(env: dict[str, str], script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_the_run_is_a_span_of_the_callers_trace(
    logged_lease_env: dict[str, str], ctl: Ctl, tmp_path: Path
) -> None:
    assert ctl("init", "--fencing").returncode == 0
    base = {**logged_lease_env, "LOCK_WAIT_SECONDS": "60", "LOCK_FENCING": "1"}
    context = {"TRACEPARENT": TRACEPARENT, "TRACESTATE": "vendor=v1", "BAGGAGE": "team=ops"}
    secret = "Bearer hunter2-header"
    with collector() as otlp, holding(base, tmp_path) as holder:
        env = traced(base, otlp.endpoint, OTEL_EXPORTER_OTLP_HEADERS=f"authorization={secret}")
        waiter = subprocess.Popen(
            [*DISLOCK, "DATABASE_URL", "sh", "-c", PRINT_CONTEXT],
            env={**env, **context},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert waiter.stderr is not None
        while "is held; waiting up to 60 s" not in waiter.stderr.readline():
            pass
        holder.send_signal(signal.SIGTERM)  # its command ends, its lease is released
        stdout, stderr = waiter.communicate(timeout=90)
    assert waiter.returncode == 0, stderr
    assert "hunter2" not in stderr
    [(resource, span)] = otlp.spans()
    assert resource["service.name"] == "nightly"
    assert otlp.posts[0][1]["authorization"] == secret  # the SDK's business: it sent it
    assert span.name == env["LOCK_KEY"]
    assert (span.trace_id.hex(), span.parent_span_id.hex()) == (TRACE_ID, PARENT_ID)
    # The command's context names the span; the rest passes through unchanged.
    traceparent, tracestate, baggage, token = stdout.strip().split("|")
    assert traceparent == f"00-{TRACE_ID}-{span.span_id.hex()}-01"
    assert (tracestate, baggage) == ("vendor=v1", "team=ops")
    attributes = values(span.attributes)
    assert attributes == {
        "dislock.key": env["LOCK_KEY"],
        "dislock.strategy": "lease",
        "host.name": socket.gethostname(),
        "dislock.attempt": 1,
        "dislock.fencing_token": int(token),
        "dislock.outcome": "ok",
        "process.exit.code": 0,
    }
    noted = events(span)
    assert noted["dislock.wait"] == [{"dislock.reason": "lease held", "dislock.seconds": 60.0}]
    assert noted["dislock.acquired"] == [{"dislock.lease": lease_key(env["LOCK_KEY"])}]
    assert noted["dislock.started"] == [{"dislock.attempt": 1, "dislock.fencing_token": int(token)}]
    assert span.status.code == Status.STATUS_CODE_UNSET
    body = otlp.posts[0][2]
    assert env["DATABASE_URL"].encode() not in body and b"hunter2" not in body


def test_a_lost_lease_and_its_kill_are_events(
    short_lease_env: dict[str, str], rows: Rows, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    with collector() as otlp:
        wrapper = subprocess.Popen(
            [*DISLOCK, "DATABASE_URL", "sh", "-c", f'touch "{started}"; exec sleep 600'],
            env=traced(short_lease_env, otlp.endpoint),
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(started)
        rows.steal(lease_key(short_lease_env["LOCK_KEY"]))
        _, stderr = wrapper.communicate(timeout=60)
    assert wrapper.returncode == 75, stderr
    span = otlp.span()
    assert span.parent_span_id == b""  # no TRACEPARENT: a trace of its own
    noted = events(span)
    [lost] = noted["dislock.lease_lost"]
    assert lost["dislock.reason"].startswith("the lock row is no longer ours")
    assert noted["dislock.kill"][0]["dislock.signal"] == "SIGTERM"
    attributes = values(span.attributes)
    assert (attributes["dislock.outcome"], attributes["process.exit.code"]) == ("lease_lost", 75)
    assert (span.status.code, span.status.message) == (Status.STATUS_CODE_ERROR, "lease_lost")


def test_a_schedule_run_names_its_slot_and_a_refused_one_says_so(cli_env: dict[str, str]) -> None:
    with collector() as otlp:
        env = traced(cli_env, otlp.endpoint)
        assert run(env, "exit 3").returncode == 3
        assert run(env, "true").returncode == 0  # the slot is taken: not run
    (_, failed), (_, refused) = otlp.spans()
    attributes = values(failed.attributes)
    assert attributes["dislock.slot"] == events(failed)["dislock.acquired"][0]["dislock.slot"]
    assert attributes["dislock.slot"].startswith("2")  # the slot's end, as an ISO instant
    assert (attributes["dislock.outcome"], attributes["process.exit.code"]) == ("failed", 3)
    assert failed.status.code == Status.STATUS_CODE_ERROR
    attributes = values(refused.attributes)
    assert (attributes["dislock.outcome"], attributes["process.exit.code"]) == ("not_acquired", 0)
    assert "dislock.not_acquired" in events(refused)
    assert refused.status.code == Status.STATUS_CODE_UNSET


def test_without_otel_settings_the_context_reaches_the_command_unchanged(
    cli_env: dict[str, str],
) -> None:
    env = {name: value for name, value in cli_env.items() if not name.startswith("OTEL_")}
    given = {"TRACEPARENT": TRACEPARENT, "TRACESTATE": "vendor=v1", "BAGGAGE": "team=ops"}
    result = run({**env, **given}, PRINT_CONTEXT)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{TRACEPARENT}|vendor=v1|team=ops|\n"


LOADED = """
import sys
from dislock.cli.wrapper.command import main
status = main(["DATABASE_URL", "true"])
print(status, sorted(name for name in sys.modules if name.startswith("opentelemetry")))
"""

WITHOUT_THE_EXTRA = """
import importlib.abc, sys
class NoOpenTelemetry(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ImportError(name)
sys.meta_path.insert(0, NoOpenTelemetry())
"""


def test_nothing_opentelemetry_is_imported_unless_asked_and_installed(
    cli_env: dict[str, str],
) -> None:
    def loaded(env: dict[str, str], prelude: str = "") -> tuple[str, str]:
        """What the run imported of OpenTelemetry, and what it logged."""
        result = subprocess.run(
            [sys.executable, "-c", prelude + LOADED],
            env={**env, "CRONJOB_LOCK_LOG_LEVEL": "INFO", "LOCK_STRATEGY": "lease"},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout, result.stderr

    plain = {name: value for name, value in cli_env.items() if not name.startswith("OTEL_")}
    assert loaded(plain)[0] == "0 []\n"
    with collector() as otlp:
        asked = traced(plain, otlp.endpoint)
        imported, logged = loaded(asked, WITHOUT_THE_EXTRA)
        assert imported == "0 []\n"
        assert (
            "dislock: OTEL_* settings ask for traces, but dislock-cli[otel] is not installed"
            in logged
        )
        assert loaded({**asked, "OTEL_SDK_DISABLED": "true"})[0] == "0 []\n"
        assert loaded({**asked, "OTEL_TRACES_EXPORTER": "none"})[0] == "0 []\n"
        assert "'opentelemetry.sdk'" in loaded(asked)[0]  # a positive control: asked, installed
    assert len(otlp.spans()) == 1


def test_a_dead_collector_costs_one_line_and_never_the_status(
    cli_env: dict[str, str],
) -> None:
    # One port that refuses, one that accepts the connection and never answers.
    with socket.socket() as closed, socket.socket() as silent:
        closed.bind(("127.0.0.1", 0))
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        for port in (closed.getsockname()[1], silent.getsockname()[1]):
            env = traced(
                cli_env,
                f"http://127.0.0.1:{port}",
                OTEL_EXPORTER_OTLP_HEADERS="authorization=hunter2-header",
                OTEL_EXPORTER_OTLP_TIMEOUT="600",  # the wrapper's bound ends it, not this
                CRONJOB_LOCK_LOG_LEVEL="DEBUG",
                LOCK_STRATEGY="lease",
            )
            result = run(env, "exit 7")
            assert result.returncode == 7, result.stderr
            lines = [line for line in result.stderr.splitlines() if "trace" in line]
            assert lines == ["dislock: the trace span of this run could not be sent"], lines
            assert "hunter2" not in result.stderr


def test_an_exporter_that_cannot_load_costs_one_line(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    # An installed exporter (by its entry point) whose module is not there.
    found = tmp_path / "broken_exporter-1.0.dist-info"
    found.mkdir()
    (found / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-exporter\nVersion: 1.0\n")
    (found / "entry_points.txt").write_text(
        "[opentelemetry_traces_exporter]\nbroken = no_such_module:Exporter\n"
    )
    env = {**cli_env, "PYTHONPATH": str(tmp_path), "LOCK_STRATEGY": "lease"}
    result = run({**env, "OTEL_TRACES_EXPORTER": "broken"}, "exit 7")
    assert result.returncode == 7, result.stderr
    assert result.stderr == (
        "dislock: no trace span for this run (ModuleNotFoundError): check the OTEL_* settings\n"
    )


def test_the_docs_example_runs_as_printed(cli_env: dict[str, str], tmp_path: Path) -> None:
    env = {name: value for name, value in cli_env.items() if not name.startswith("OTEL_")}
    env = {**env, "PATH": dislock_on_path(tmp_path)}
    del env["LOCK_KEY"], env["CRON_SCHEDULE"]
    result = run_pasted("tracing.md", "## A worked example", env)
    assert result.returncode == 0, result.stderr
    printed, _, exported = result.stdout.partition("\n")
    span = json.loads(exported)  # what the console exporter printed
    assert span["name"] == "nightly-report"
    assert span["parent_id"] == f"0x{PARENT_ID}"
    assert span["context"]["trace_id"] == f"0x{TRACE_ID}"
    assert printed == f"child: 00-{TRACE_ID}-{span['context']['span_id'][2:]}-01"
    assert span["attributes"]["dislock.outcome"] == "ok"
    assert span["resource"]["attributes"]["service.name"] == "nightly-report"
