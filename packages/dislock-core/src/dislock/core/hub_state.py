"""The shared connection's bookkeeping, whichever its flavour: which hub serves which
database URL (``Registry``), which link is current, whether it came through a crowded
door, whether it may prepare its statements, and the server timeline the locks were
taken on.

Both flavours' ``Hub`` extend ``HubState``: what they add opens, sends on, watches
and retires the link.  Nothing here waits or touches a socket; the link's current
slot is guarded by a thread lock, never held across I/O, because in the sync flavour
the renewer's thread retires links while locks open new ones.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Generic, Protocol, TypeVar

from psycopg import ConnectionInfo

from dislock.core.dsn import host_count, longest_connect_timeout, one_line, scrub
from dislock.core.failover import timeline_change
from dislock.core.preparing import Preparation, prepare_threshold

logger = logging.getLogger("dislock")


class Registry:
    """The hubs by URL, of a process (of an event loop, with asyncio: the flavour's
    ``local_registry``), and the lock that guards taking and giving one back (held
    only for dictionary work, never across I/O)."""

    def __init__(self) -> None:
        self.hubs: dict[str, Any] = {}
        self.lock = threading.Lock()


class Connection(Protocol):
    """What the bookkeeping reads of a psycopg connection, of either flavour."""

    @property
    def info(self) -> ConnectionInfo: ...

    prepare_threshold: int | None


class Linked(Protocol):
    """What the bookkeeping reads of a flavour's ``Link``."""

    retired: bool

    @property
    def conn(self) -> Connection: ...


LinkT = TypeVar("LinkT", bound=Linked)


class HubState(Generic[LinkT]):
    """The shared connection to one database, between statements (the flavour's ``Hub``)."""

    def __init__(self, url: str, connect_timeout: float) -> None:
        self.url = url
        self.connect_timeout = connect_timeout
        # What a patient try needs to share its time among the URL's hosts.
        self._hosts = host_count(url)
        self._longest_connect = longest_connect_timeout(url, connect_timeout)
        self.users = 0
        """Locks and ``keep_connected`` scopes using the hub (guarded by the registry)."""
        self._guard = threading.Lock()
        self._link: LinkT | None = None
        self.timeline: int | None = None
        """The server timeline a lock was last taken on (see ``dislock.core.failover``)."""
        # The current link's statement count, until it may prepare (``dislock.core.preparing``).
        self._preparation: tuple[LinkT, Preparation] | None = None
        # The link last opened after a refused or failed try (``crowded``).
        self._crowded_link: LinkT | None = None

    @property
    def crowded(self) -> bool:
        """Whether the next statement is the first on a connection opened only after
        refused or failed tries: a herd at the server's door, where a look at the
        row first saves the server work (``dislock.core.acquisition.claiming``)."""
        link, counted = self._link, self._preparation
        if link is None or link.retired or link is not self._crowded_link:
            return False
        return counted is not None and counted[0] is link and counted[1].statements == 0

    def _adopt(self, link: LinkT) -> None:
        """Make ``link``, just opened, the current one, with its statements uncounted."""
        with self._guard:
            self._link = link
            self._preparation = (link, Preparation())

    def _forget(self, link: LinkT) -> None:
        """Stop using ``link`` (a link just opened by another thread stays current)."""
        with self._guard:
            if self._link is link:
                self._link = None

    def _check_due(self, link: LinkT) -> bool:
        """Count a statement on ``link``; whether it is time to ask whether the link
        may prepare (``dislock.core.preparing``)."""
        counted = self._preparation
        return counted is not None and counted[0] is link and counted[1].check_due()

    def _prepare_if_direct(self, link: LinkT, server_pid: object) -> None:
        """Let ``link`` prepare the statements it repeats if the server's own process
        id (``server_pid``) is the one its startup announced: no pooler in between."""
        threshold = prepare_threshold(link.conn.info.backend_pid, server_pid)
        link.conn.prepare_threshold = threshold
        if threshold is None:
            logger.debug("a pooler is in between: statements stay unprepared")
        else:
            logger.debug("direct connection: repeated statements are prepared")

    def _stop_preparing(self, link: LinkT, exc: Exception) -> None:
        """Never prepare on ``link`` again: something between here and the server (a
        pooler that passes the server's backend pid on) lost a prepared statement."""
        link.conn.prepare_threshold = None
        logger.warning(
            "the server lost a prepared statement (%s); statements on this connection"
            " stay unprepared from now on",
            scrub(one_line(str(exc)), self.url),
        )

    def note_timeline(self, timeline: object) -> None:
        if isinstance(timeline, int):
            self.timeline = timeline

    def _timeline_read(self, timeline: int | None) -> None:
        """A holder reconnected to a server on ``timeline``: say so if the server's
        history changed since the locks were taken."""
        warning = timeline_change(self.timeline, timeline)
        if warning:
            logger.warning("%s", warning)
        self.note_timeline(timeline)
