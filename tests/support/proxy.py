"""Loopback TCP proxies for network faults: one that can be told to stop forwarding
(a network partition as the client sees it, the connection still open and nothing
coming back), one that breaks a connection while a statement is in flight, and a
host that never answers at all."""

from __future__ import annotations

import re
import select
import socket
import threading
from typing import Self

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class _Relay:
    """A loopback port whose every client is served by ``_serve`` in the accepting
    thread, typically connected to ``upstream`` (a TCP address, or the path of a
    Unix socket) and pumped in a thread of its own."""

    def __init__(self, upstream: tuple[str, int] | str) -> None:
        self._upstream = upstream
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for sock in self._sockets:
            sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect_upstream(self) -> socket.socket:
        if isinstance(self._upstream, str):
            server = socket.socket(socket.AF_UNIX)
            server.connect(self._upstream)
        else:
            server = socket.create_connection(self._upstream)
        self._sockets.append(server)
        return server

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._sockets.append(client)
            self._serve(client)

    def _serve(self, client: socket.socket) -> None:
        raise NotImplementedError


class BlackholeProxy(_Relay):
    def __init__(self, upstream: tuple[str, int]) -> None:
        self._blackholed = threading.Event()
        self._cuts: list[threading.Event] = []
        super().__init__(upstream)

    def blackhole(self) -> None:
        """From now on, swallow everything in both directions and connect nothing."""
        self._blackholed.set()
        self.cut_existing()

    def heal(self) -> None:
        """Forward new connections again (the ones swallowed so far stay dead: their
        clients time out and connect again, as after a real partition heals)."""
        self._blackholed.clear()

    def cut_existing(self) -> None:
        """Swallow everything on the connections open now; new ones still get through
        (a NAT or firewall that forgot its state: old sockets hang, new ones work)."""
        for cut in self._cuts:
            cut.set()

    def _serve(self, client: socket.socket) -> None:
        if self._blackholed.is_set():
            return  # accepted, never answered
        server = self._connect_upstream()
        cut = threading.Event()
        self._cuts.append(cut)
        threading.Thread(target=self._pump, args=(client, server, cut), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket, cut: threading.Event) -> None:
        peers = {client: server, server: client}
        try:
            while not self._closed.is_set():
                readable, _, _ = select.select(list(peers), [], [], 0.1)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        # One side hung up: pass that on (unless cut off), as a
                        # router would, rather than leave the other side waiting.
                        if not cut.is_set():
                            peers[sock].shutdown(socket.SHUT_WR)
                        return
                    if not cut.is_set():
                        peers[sock].sendall(data)
        except OSError:
            return


class SilentHost:
    """A loopback port where the kernel accepts connections and nobody ever answers:
    a frozen or partitioned server as a client sees it (its connection times out)."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)  # never accepted
        self.port: int = self._listener.getsockname()[1]

    def first_of(self, url: str, **extra: str) -> str:
        """``url`` with this host tried first, as a multi-host URL that asks for the
        primary lists a failed one (``extra``: more connection parameters)."""
        params = conninfo_to_dict(url)
        params["host"] = f"127.0.0.1,{params.get('host', '')}"
        params["port"] = f"{self.port},{params.get('port', 5432)}"
        params.update(target_session_attrs="read-write", **extra)
        return make_conninfo("", **params)

    def alone(self, url: str) -> str:
        """``url`` pointing at this host only."""
        params = conninfo_to_dict(url)
        params.update(host="127.0.0.1", port=str(self.port))
        return make_conninfo("", **params)

    def close(self) -> None:
        self._listener.close()

    def __enter__(self) -> SilentHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


READY_FOR_QUERY = b"Z\x00\x00\x00\x05"
"""The server's ReadyForQuery message, up to its status byte: the end of an answer,
after the statement's (autocommit) transaction ended."""


class AnswerCutter(_Relay):
    """A loopback TCP proxy that, when armed, breaks the first connection that sends a
    statement containing ``marker``: the client's connection closes while the
    statement is in flight, as when a failover restarts the server under it.

    ``committed=True`` forwards the statement and waits for the server's whole
    answer (so the statement ran and committed) before hanging up on the client
    without it; ``committed=False`` hangs up without forwarding anything (the
    statement never ran).  Other connections and statements pass untouched.
    """

    def __init__(self, url: str) -> None:
        params = conninfo_to_dict(url)
        host, port = str(params.get("host") or "/tmp"), int(params.get("port") or 5432)
        self._guard = threading.Lock()
        self._armed: tuple[bytes, bool] | None = None
        self.cuts = 0
        """How many connections were broken so far."""
        self._refuse_after_cut = False
        # The server's Unix socket, or its TCP port.
        super().__init__(f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port))

    def url(self, url: str) -> str:
        """``url`` (the upstream server's) through this proxy."""
        params = conninfo_to_dict(url)
        params.update(host="127.0.0.1", port=str(self.port))
        return make_conninfo("", **params)

    def arm(self, marker: bytes, *, committed: bool) -> None:
        """Cut under the next statement whose bytes ``marker`` (a regular expression)
        finds."""
        with self._guard:
            self._armed = (marker, committed)

    def refuse_after_cut(self) -> None:
        """Once a connection was cut, refuse every new one: the server stays away."""
        self._refuse_after_cut = True

    def _serve(self, client: socket.socket) -> None:
        server = self._connect_upstream()
        threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _take_cut(self, data: bytes) -> bool | None:
        """Whether to cut here (and how), disarming: None to pass ``data`` on."""
        with self._guard:
            if self._armed is None or re.search(self._armed[0], data) is None:
                return None
            committed = self._armed[1]
            self._armed = None
            self.cuts += 1
            return committed

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peers = {client: server, server: client}
        try:
            while not self._closed.is_set():
                readable, _, _ = select.select(list(peers), [], [], 0.1)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        peers[sock].shutdown(socket.SHUT_WR)
                        return
                    committed = None if sock is server else self._take_cut(data)
                    if committed is None:
                        peers[sock].sendall(data)
                        continue
                    if committed:
                        server.sendall(data)
                        answer = b""
                        while READY_FOR_QUERY not in answer:
                            more = server.recv(65536)
                            if not more:
                                break
                            answer += more
                    if self._refuse_after_cut:
                        # (A close alone would leave the port listening while
                        # the accepting thread waits: shutdown wakes it.)
                        self._listener.shutdown(socket.SHUT_RDWR)
                        self._listener.close()  # new connections are refused
                    client.close()
                    server.close()
                    return
        except OSError:
            return
