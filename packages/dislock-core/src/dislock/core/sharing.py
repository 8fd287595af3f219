"""The book of shared connections: which hub serves which database URL.

Every lock of a process (of an event loop, with asyncio) on one database goes
through one hub and its connection.  The sync and asyncio shells keep one of
these per process or per loop; what they share is the book itself.
"""

from __future__ import annotations

import threading
from typing import Any


class Registry:
    """The shared connections by URL, and the lock that guards taking and giving
    one back (held only for dictionary work, never across I/O)."""

    def __init__(self) -> None:
        self.hubs: dict[str, Any] = {}
        self.lock = threading.Lock()
