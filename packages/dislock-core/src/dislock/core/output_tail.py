"""The last bytes of a wrapped command's output, kept for its run's history row
(``LockContext.output_tail_bytes``, ``LOCK_OUTPUT_TAIL_BYTES``).

The command's stdout and stderr are pipes of the wrapper's: a thread per stream
(no flavour: written once for both wrappers) copies what arrives to descriptor 1
or 2, as inherited streams would have shown it, and keeps the last bytes in a
``Tail``.  The lock URL and every password the wrapper knows (``secrets_in``) are
replaced before the tail is cut, so that a cut never leaves a secret's end (docs/cli.md).
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time

from dislock.core.dsn import scrub, secrets_in

CHUNK = 65536
"""Bytes read from a pipe at a time (a pipe holds 64 KiB on Linux)."""

JOIN_SECONDS = 2.0
"""How long the end of a run waits for output that no longer comes (a descendant
that left the group may hold a pipe open)."""


class Tail:
    """The last bytes of one stream, and the text stored for them."""

    def __init__(self, limit: int, url: str = "") -> None:
        self.limit = limit
        self._url = url
        # A secret may be written percent-encoded: three bytes for each of its bytes.
        secrets = [secret for secret in (url, *secrets_in(url)) if secret]
        self._scrubbed = bool(secrets)
        self._longest = max((3 * len(secret.encode()) for secret in secrets), default=0)
        # Kept: enough bytes for `limit` characters of four bytes each, once the text of
        # the first `_longest` is dropped (it may hold the end of a secret whose start
        # is gone), each of them four characters at most (`\xNN`).
        self._keep = 4 * (limit + self._longest)
        self._data = bytearray()
        self._cut = False
        self._lock = threading.Lock()

    def feed(self, data: bytes) -> None:
        with self._lock:
            self._data += data
            if len(self._data) > self._keep:
                del self._data[: len(self._data) - self._keep]
                self._cut = True

    def text(self) -> str | None:
        """What the history keeps of the stream (None: it wrote nothing)."""
        with self._lock:
            data, cut = bytes(self._data), self._cut
        if not data:
            return None
        text = data.decode("utf-8", "backslashreplace").replace("\x00", "\\x00")
        if self._scrubbed:
            # Scrubbed whole, before the cut: no part of a secret is left to cut into.
            text = scrub(text.replace(self._url, "***") if self._url else text, self._url)
        if cut:
            # Only the front can still hold part of a secret (its start was dropped),
            # and scrubbing may have shortened what follows: drop the front's text.
            text = text[4 * self._longest :]
        return text[-self.limit :]


class _Copy(threading.Thread):
    def __init__(self, source: int, target: int, tail: Tail) -> None:
        super().__init__(name="dislock-output", daemon=True)
        self._source, self._target, self.tail = source, target, tail
        self.reading = True  # waiting for the command's output, not passing it on

    def run(self) -> None:
        try:
            while data := os.read(self._source, CHUNK):
                self.reading = False
                self.tail.feed(data)
                if not _write_all(self._target, data):
                    # Ours is closed or a broken pipe: the command's becomes one too, as
                    # it would have with the stream inherited (`dislock … yes | head -1`).
                    break
                self.reading = True
        except OSError:
            pass  # the pipe is gone: nothing more will come
        finally:
            self.reading = True
            with contextlib.suppress(OSError):
                os.close(self._source)


def _write_all(fd: int, data: bytes) -> bool:
    """Write ``data`` whole, waiting on a non-blocking ``fd`` as a blocking one would;
    False once ``fd`` refuses (closed, a broken pipe)."""
    view = memoryview(data)
    try:
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                select.select([], [fd], [])
    except OSError:
        return False
    return True


class OutputTails:
    """The pipes a command writes its stdout and stderr to, and their copying to ours."""

    def __init__(self, limit: int, url: str) -> None:
        self._pipes = [os.pipe(), os.pipe()]
        self._copies: list[_Copy] = []
        self._tails = [Tail(limit, url), Tail(limit, url)]

    @property
    def child_ends(self) -> tuple[int, int]:
        """The write ends, for the command's stdout and stderr."""
        return self._pipes[0][1], self._pipes[1][1]

    def start(self) -> None:
        """Once the command has started: close our copies of its ends, so that the
        pipes end when it (and whatever inherited them) has gone, and copy."""
        for (read_end, write_end), target, tail in zip(
            self._pipes, (1, 2), self._tails, strict=True
        ):
            os.close(write_end)
            copy = _Copy(read_end, target, tail)
            copy.start()
            self._copies.append(copy)

    def abandon(self) -> None:
        """The command did not start: close every end."""
        for read_end, write_end in self._pipes:
            for fd in (read_end, write_end):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def finish(self) -> tuple[str | None, str | None]:
        """Wait for the copying to reach the pipes' ends (as long as it passes output
        on, up to ``JOIN_SECONDS`` for output that no longer comes); the stored text of
        stdout and of stderr."""
        deadline = time.monotonic() + JOIN_SECONDS
        while any(copy.is_alive() for copy in self._copies):
            if time.monotonic() >= deadline and all(
                copy.reading for copy in self._copies if copy.is_alive()
            ):
                break
            for copy in self._copies:
                copy.join(0.05)
        return self._tails[0].text(), self._tails[1].text()
