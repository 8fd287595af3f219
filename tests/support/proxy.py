"""A loopback TCP proxy that can be told to stop forwarding: a network partition
as the client sees it, with the connection still open and nothing coming back;
and a host that never answers at all."""

from __future__ import annotations

import select
import socket
import threading

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class BlackholeProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._blackholed = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._cuts: list[threading.Event] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def blackhole(self) -> None:
        """From now on, swallow everything in both directions and connect nothing."""
        self._blackholed.set()
        self.cut_existing()

    def cut_existing(self) -> None:
        """Swallow everything on the connections open now; new ones still get through
        (a NAT or firewall that forgot its state: old sockets hang, new ones work)."""
        for cut in self._cuts:
            cut.set()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._sockets.append(client)
            if self._blackholed.is_set():
                continue  # accepted, never answered
            server = socket.create_connection(self.upstream)
            self._sockets.append(server)
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
