"""The rules ``dislockctl serve`` applies to a request before it reads anything: which
``Host`` names it answers for (a page on loopback is otherwise readable by any web
page a local browser opens, through a DNS name pointed at 127.0.0.1: DNS
rebinding), how many connections it serves at once (``Admission``), how long a
client may take, and where it listens (``parse_listen``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from collections.abc import Hashable, Iterable, Sequence
from typing import Generic, NamedTuple, TypeVar

from dislock.core.errors import ConfigurationError


class Limits(NamedTuple):
    max_connections: int = 32
    """``--max-connections``: one more is answered 503 at once and closed."""
    request_timeout: float = 5.0
    """``--request-timeout``, in seconds."""
    max_per_client: int = 8
    """``--max-connections-per-client``: so that one client's idle connections cannot
    take every one of ``max_connections``."""
    max_idle: int = 16
    """``--max-idle-connections``: so that idle connections from many addresses cannot
    take every one of ``max_connections`` (all of 127.0.0.0/8 is this machine's)."""


def client_of(address: str) -> str:
    """Who a peer address counts as, for ``max_per_client``: an IPv4 address (also an
    IPv4-mapped one) as itself, an IPv6 address as its /64, which one host can fill."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address  # not an IP address (a Unix socket): as given
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.compressed
    if isinstance(ip, ipaddress.IPv4Address) or ip.is_loopback:
        return ip.compressed
    return ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)).compressed


Conn = TypeVar("Conn", bound=Hashable)


class Admission(Generic[Conn]):
    """The connections being served, in all and per client (``client_of``), which of them
    are idle (their request not read yet), and those closed for being idle whose threads
    have not ended yet (``closing``): they count against ``max_connections`` until then,
    so that the threads alive never outnumber it.  Not thread-safe: the server holds its
    lock around each call."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.clients: dict[Conn, str] = {}
        self.by_client: dict[str, int] = {}
        self.idle: dict[Conn, None] = {}  # oldest first
        self.closing: set[Conn] = set()

    def admit(self, client: str, conn: Conn) -> tuple[str | None, list[Conn]]:
        """Count ``conn`` from ``client`` in, idle, and None; or refuse it: ``"all"`` when
        ``max_connections`` are served or closing, ``"client"`` when ``max_per_client``
        are ``client``'s.  Also the oldest idle connections to close first, while
        ``max_idle`` are idle."""
        if self.by_client.get(client, 0) >= self.limits.max_per_client:
            return "client", []
        evicted = []
        while self.idle and len(self.idle) >= self.limits.max_idle:
            evicted.append(next(iter(self.idle)))
            self._forget(evicted[-1])
            self.closing.add(evicted[-1])
        if len(self.clients) + len(self.closing) >= self.limits.max_connections:
            return "all", evicted
        self.clients[conn] = client
        self.by_client[client] = self.by_client.get(client, 0) + 1
        self.idle[conn] = None
        return None, evicted

    def started(self, conn: Conn) -> bool:
        """``conn``'s request was read: it is no longer idle.  Whether it is still to be
        answered (False: it was closed for being idle meanwhile)."""
        self.idle.pop(conn, None)
        return conn in self.clients

    def done(self, conn: Conn) -> None:
        """An admitted connection's thread ended."""
        self.closing.discard(conn)
        self._forget(conn)

    def _forget(self, conn: Conn) -> None:
        client = self.clients.pop(conn, None)
        if client is None:
            return  # closed for being idle, already not counted
        self.idle.pop(conn, None)
        left = self.by_client[client] - 1
        if left:
            self.by_client[client] = left
        else:
            del self.by_client[client]  # a client gone leaves nothing behind


def request_timeout(text: str) -> float:
    """A ``--request-timeout`` value: seconds, more than 0 and at most an hour."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 3600:  # also refuses nan
        raise ConfigurationError(
            f"--request-timeout must be a number of seconds from 0 to 3600, got {text!r}"
        )
    return value


_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,62})(?:\.[a-z0-9_](?:[a-z0-9_-]{0,62}))*")


def host_name(text: str) -> str | None:
    """The host of a ``Host`` header (``name``, ``name:port``, ``[IPv6]:port``) in one
    spelling for comparing (lower case, no port, no brackets, no final dot, an IP
    address canonical); None when it is not a host name or address."""
    raw = text.strip()
    if raw.startswith("["):
        inside, sep, rest = raw[1:].partition("]")
        if sep and (rest == "" or (rest[:1] == ":" and rest[1:].isdigit())):
            with contextlib.suppress(ValueError):
                return ipaddress.IPv6Address(inside).compressed
        return None
    host, sep, port = raw.partition(":")
    if sep and not port.isdigit():
        return None  # an IPv6 address without brackets, or a port that is not one
    return _canonical(host)


def _canonical(host: str) -> str | None:
    name = host.lower().removesuffix(".")
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(name).compressed
    return name if len(name) <= 253 and _NAME.fullmatch(name) else None


def allowed_host(text: str) -> str:
    """An ``--allow-host`` value: a host name or an IP address (an IPv6 one with or
    without brackets), without a port."""
    raw = text.strip()
    inside = raw[1:-1] if raw.startswith("[") and raw.endswith("]") else raw
    found = _canonical(inside)
    if found is None:
        raise ConfigurationError(
            f"--allow-host {text!r}: give a host name or an IP address, without a port"
            " (e.g. --allow-host ops-1.example.internal)"
        )
    return found


class HostPolicy:
    """The ``Host`` names answered: the loopback names, the host ``--listen`` names,
    and every ``--allow-host``."""

    def __init__(self, listen_host: str, extra: Iterable[str] = ()) -> None:
        names = {_canonical(name) for name in ("localhost", "127.0.0.1", "::1", listen_host)}
        names.update(allowed_host(name) for name in extra)
        self.names = frozenset(name for name in names if name is not None)

    def allows(self, headers: Sequence[str]) -> bool:
        """Whether a request with these ``Host`` headers is answered.  One without any is (an
        HTTP/1.0 client; a browser always sends one); several are not."""
        return not headers or (len(headers) == 1 and host_name(headers[0]) in self.names)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPV6]:PORT`` or a bare ``PORT`` (on loopback) into host and port.
    An empty host is refused rather than read as "every interface": exposing the
    fleet's state beyond this machine must be spelled out (``0.0.0.0:9655``)."""
    raw = text.strip()
    if not raw:
        raise ConfigurationError("--listen is empty; give HOST:PORT, e.g. 127.0.0.1:9655")
    if raw.isdigit():
        host, port_text = "127.0.0.1", raw  # loopback only: exposing it is a decision
    elif raw.startswith("["):
        inside, sep, rest = raw[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ConfigurationError(f"--listen {raw!r}: expected [IPV6]:PORT, e.g. [::1]:9655")
        host, port_text = inside, rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigurationError(f"--listen {raw!r}: {host!r} is not an IPv6 address") from None
    else:
        host, sep, port_text = raw.rpartition(":")
        if not sep:
            raise ConfigurationError(f"--listen {raw!r}: expected HOST:PORT, e.g. 127.0.0.1:9655")
        if not host:
            raise ConfigurationError(
                f"--listen {raw!r} has no host; say 0.0.0.0:{port_text} to listen on every"
                " interface, or 127.0.0.1:PORT for this machine only"
            )
        if ":" in host:
            raise ConfigurationError(
                f"--listen {raw!r}: write an IPv6 host in brackets, [::1]:9655"
            )
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigurationError(f"--listen {raw!r}: the port must be a number from 0 to 65535")
    return host, int(port_text)
