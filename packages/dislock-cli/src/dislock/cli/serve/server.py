"""``dislockctl URL_VARIABLE serve``: the fleet's state as Prometheus metrics and a status page.

A small read-only HTTP server: this module only does I/O.  Every request that needs
the database reads one snapshot on one kept connection (``fleet_reader``); a
database that does not answer is reported (``dislock_up 0``, a banner), never a
crash.  The URL appears in no response and no log line.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from dislock.cli import EXIT_OK, EXIT_USAGE
from dislock.cli.commands._call import error
from dislock.cli.run_metrics import Exposition
from dislock.cli.serve.fleet_reader import FleetReader
from dislock.cli.serve.http_policy import Admission, HostPolicy, Limits, client_of, parse_listen
from dislock.cli.serve.key_page import KEY_PATH, key_page
from dislock.cli.serve.metrics import metric_families
from dislock.cli.serve.status_page import STRIP_ROWS, page_order, render_page
from dislock.cli.wrapper.command import configure_logging
from dislock.core.dsn import scrub
from dislock.core.errors import ConfigurationError

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

logger = logging.getLogger("dislock.serve")

BUSY_LOG_INTERVAL = 60.0
"""Seconds between two log lines about connections refused for being too many."""

CLOSING_WAIT = 1.0
"""Seconds a new connection may wait for the threads of idle connections closed to make
room to end (they have nothing left to wait for) before it is refused."""


class _Deadline(io.RawIOBase):
    """A client's socket read or written against one deadline for its whole request, or
    for the whole answer: a client that sends, or reads, a byte every few seconds is cut
    off as one that sends or reads nothing."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline
        self.ended = False  # the client closed its side (or was shut down)

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def _left(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the client did not send its request, or read the answer, in time")
        self._sock.settimeout(left)

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        self._left()
        got = self._sock.recv_into(buffer)
        self.ended = self.ended or not got
        return got

    def write(self, data: ReadableBuffer, /) -> int:
        # sendall's timeout bounds all of it (Python >= 3.5), not each send.
        self._left()
        self._sock.sendall(data)
        return memoryview(data).nbytes


def _unavailable(body: bytes) -> bytes:
    return (
        b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: %d\r\nRetry-After: 5\r\nConnection: close\r\n\r\n%s"
    ) % (len(body), body)


_BUSY = _unavailable(b"too many connections at once; try again\n")
_CLIENT_BUSY = _unavailable(b"too many connections at once from your address; try again\n")

_MISDIRECTED = (
    b"this server does not answer for that host name; dislockctl serve --allow-host adds one\n"
)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "dislockctl"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        # The whole request within the timeout, not each read of it.
        self.rfile.close()
        deadline = time.monotonic() + self.server.limits.request_timeout
        self._raw = _Deadline(self.connection, deadline)
        self.rfile = io.BufferedReader(self._raw)

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        admitted = self.server.started(self.connection)  # read (or refused): no longer idle
        # http.client reads the end of the connection as the blank line ending the
        # headers: a request cut short would be answered, a database read for each
        # half-sent request closed (security review #61: thousands of threads waiting).
        if parsed and (self._raw.ended or not admitted):
            self.close_connection = True
            return False
        return parsed

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        hosts = self.headers.get_all("Host") or []
        try:
            if not self.server.hosts.allows(hosts):
                # Nothing of the fleet for a name nobody allowed (DNS rebinding).
                self.server.refused_host(hosts)
                status, kind, payload = 421, "text/plain; charset=utf-8", _MISDIRECTED
            elif path == "/metrics":
                families = metric_families(self.server.reader.snapshot(scrape=True))
                status, kind, payload = 200, CONTENT_TYPE_LATEST, self.server.exposition(families)
            elif path == "/":
                reader = self.server.reader
                snapshot = reader.snapshot()
                # Only the page's strips read back past the window, and only its first rows'.
                shown = [key.lock_key for key in page_order(snapshot.keys)[:STRIP_ROWS]]
                page = render_page(reader.with_strips(snapshot, shown))
                status, kind, payload = 200, "text/html; charset=utf-8", page.encode()
            elif path.startswith(KEY_PATH):
                status, kind, payload = key_page(self.server.reader, path)
            elif path == "/healthz":
                status, kind, payload = 200, "text/plain; charset=utf-8", b"ok\n"
            else:
                status, kind, payload = 404, "text/plain; charset=utf-8", b"not found\n"
        except Exception as exc:  # a bug must not take the server down or leak details
            logger.error("%s on %s: %s", type(exc).__name__, path, scrub(str(exc), self.server.url))
            status, kind, payload = 500, "text/plain; charset=utf-8", b"internal error\n"
        # The whole answer within the timeout too: a slow reader holds no worker longer.
        deadline = time.monotonic() + self.server.limits.request_timeout
        self.wfile = io.BufferedWriter(_Deadline(self.connection, deadline))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        # No script, no external anything: the page is its own HTML and CSS.
        self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
        self.end_headers()
        if body:
            self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log: a scrape every 15 s is not news


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # connections the kernel holds until they are accepted (or refused)

    def __init__(
        self,
        address: tuple[str, int],
        family: int,
        url: str,
        reader: FleetReader,
        hosts: HostPolicy,
        limits: Limits,
    ) -> None:
        self.address_family = family
        self.url = url
        self.reader = reader
        self.hosts = hosts
        self.limits = limits
        self.exposition = Exposition()
        self._admission: Admission[socket.socket] = Admission(limits)
        self._active_lock = threading.Condition()  # notified as a connection's thread ends
        self._ended: list[threading.Thread] = []
        self._told: dict[str, float] = {}
        self._hosts_told: set[str] = set()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        client = client_of(str(client_address[0]))
        evicted: list[socket.socket] = []
        deadline = time.monotonic() + CLOSING_WAIT
        with self._active_lock:
            while True:
                # Threads whose connections ended close a socket and return: joined, so
                # that they and the ones serving never outnumber --max-connections.
                for ended in self._ended:
                    ended.join(CLOSING_WAIT)
                self._ended.clear()
                refused, closed = self._admission.admit(client, request)
                for idle in closed:
                    # Under the lock: its thread closes it only once it is no longer counted.
                    with contextlib.suppress(OSError):
                        idle.shutdown(socket.SHUT_RDWR)  # its thread reads the end, and ends
                evicted += closed
                # Full with threads of closed idle connections: room in a moment.
                left = deadline - time.monotonic()
                if refused != "all" or not self._admission.closing or left <= 0:
                    break
                self._active_lock.wait(left)
        if evicted:
            self._tell(
                "idle",
                f"{self.limits.max_idle} idle connections at once: closing the"
                " oldest for each new one (--max-idle-connections)",
            )
        if refused is not None:
            self._refuse(request, client, refused)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._done(request)  # no thread started to end it
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        # As ThreadingMixIn's, but no longer counted before it is closed (above).
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self._done(request, threading.current_thread())
            self.shutdown_request(request)

    def started(self, request: socket.socket) -> bool:
        with self._active_lock:
            return self._admission.started(request)

    def _done(self, request: socket.socket, thread: threading.Thread | None = None) -> None:
        with self._active_lock:
            self._admission.done(request)
            if thread is not None:
                self._ended.append(thread)
            self._active_lock.notify()

    def _refuse(self, request: socket.socket, client: str, refused: str) -> None:
        """503 and close, never waiting: this is the thread that accepts connections."""
        try:
            request.setblocking(False)
            # What the client already sent, read so that closing does not reset the
            # connection before it has read the answer.
            with contextlib.suppress(BlockingIOError, InterruptedError):
                request.recv(65536)
            request.send(_BUSY if refused == "all" else _CLIENT_BUSY)
        except OSError:
            pass
        self.shutdown_request(request)
        if refused == "all":
            limit = self.limits.max_connections
            self._tell("all", f"{limit} connections at once: refusing more with 503 until one ends")
        else:
            self._tell(
                refused,
                f"{self.limits.max_per_client} connections at once from {client}: refusing more"
                " from that address with 503 until one ends (--max-connections-per-client)",
            )

    def _tell(self, kind: str, message: str) -> None:
        """Log ``message`` unless one of its ``kind`` was logged within the last minute."""
        now = time.monotonic()
        if now - self._told.get(kind, -math.inf) >= BUSY_LOG_INTERVAL:
            self._told[kind] = now
            logger.warning("%s", message)

    def refused_host(self, headers: list[str]) -> None:
        """Log the first few names refused (the log is not the attacker's to fill)."""
        name = headers[0] if len(headers) == 1 else f"{len(headers)} Host headers"
        with self._active_lock:
            if name in self._hosts_told or len(self._hosts_told) >= 16:
                return
            self._hosts_told.add(name)
        shown = name if len(name) <= 64 else name[:64] + "..."
        logger.warning(
            "refused a request for Host %r: not an allowed name (add it with --allow-host)",
            shown,
        )

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            # A client that went away, or never sent its request: not the server's fault.
            logger.debug("a client went away: %s", type(exc).__name__)
            return
        name = type(exc).__name__
        logger.error("%s while answering a client: %s", name, scrub(str(exc), self.url))


def serve(
    url: str,
    table: tuple[str, ...],
    history: tuple[str, ...],
    listen: str,
    allow_hosts: Sequence[str] = (),
    limits: Limits | None = None,
) -> int:
    """Serve until SIGTERM or SIGINT; the exit status."""
    configure_logging(logger, "dislockctl serve", logging.INFO)
    try:
        host, port = parse_listen(listen)
        hosts = HostPolicy(host, allow_hosts)
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except ConfigurationError as exc:
        return error(str(exc), EXIT_USAGE)
    except socket.gaierror as exc:
        return error(f"--listen {listen!r}: {exc.strerror}", EXIT_USAGE)

    reader = FleetReader(url, table, history)
    missing = reader.check_tables()
    if missing is not None:
        reader.close()
        return error(missing)
    try:
        server = _Server((host, port), found[0][0], url, reader, hosts, limits or Limits())
    except OSError as exc:
        reader.close()
        return error(f"cannot listen on {listen}: {exc.strerror or exc}")

    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda signum, frame: stop.set())
        for sig in (signal.SIGTERM, signal.SIGINT)
    }
    threading.Thread(target=server.serve_forever, name="dislockctl-serve", daemon=True).start()
    bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    logger.info("listening on http://%s:%d/ (metrics at /metrics)", shown, bound_port)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.shutdown()
        server.server_close()
        reader.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    logger.info("stopped")
    return EXIT_OK
