"""Drivers of the contract suite: one per implementation, one behaviour set for all.

A contract test receives a ``Driver`` and only talks to it, so the same test runs
against the sync API, the asyncio API and (for what it exposes) the CLI.  Each
driver turns "hold these locks", "release them (with this error from the block)"
and "run this command under locks" into its implementation's calls.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import dislock
import dislock.aio
from dislock import (
    LEASE_LOST_EXIT_CODE,
    ConfigurationError,
    LeaseLossPolicy,
    LeaseLostError,
    LockContext,
    LockNotAcquiredError,
)
from dislock.core import variables
from tests.support.hosts import on_host

T = TypeVar("T")


class Holding(ABC):
    """Locks entered by a driver and not yet released."""

    @abstractmethod
    def lease_lost_event_set(self) -> bool | None:
        """The session's ``lease_lost`` event state; None when the session has none."""

    def wait_lease_lost(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.lease_lost_event_set():
                return True
            time.sleep(0.02)
        return bool(self.lease_lost_event_set())

    @abstractmethod
    def fencing_token(self) -> int | None:
        """The token the session hands to the work (None without fencing)."""

    @abstractmethod
    def release(self, error: BaseException | None = None) -> None:
        """Leave the locks as a block would: normally, or with ``error`` raised in it.

        Raises whatever leaving raised; if the block's ``error`` was not
        suppressed, it is re-raised here as the block's caller would see it.
        """


class Driver(ABC):
    name: str
    features: frozenset[str]
    """What beyond locks and wrapped commands the implementation offers:
    ``python-api`` (lock classes, ``next_run_time``, exceptions from a block)."""

    @abstractmethod
    def hold(self, context: LockContext, strategies: Sequence[str]) -> Holding:
        """Enter ``acquire_locks(context, strategies)``."""

    @abstractmethod
    def hold_lock(self, kind: str, context: LockContext) -> Holding:
        """Enter a ``ScheduleLock`` or ``LeaseLock`` (``kind``) directly."""

    @abstractmethod
    def run_with_locks(
        self, argv: Sequence[str], context: LockContext, strategies: Sequence[str]
    ) -> int:
        """The exit status ``run_with_locks`` returns."""

    def is_owner_token(self, value: str, context: LockContext) -> bool:
        """Whether a row's ``value`` is the token this driver wrote for ``context``."""
        return value == context.owner

    def renewals(self, holding: Holding) -> int:
        """How many renewals the holding's lease has made (Python API only)."""
        assert isinstance(holding, _PythonHolding) and holding.lease is not None
        renewals: int = holding.lease.renewals
        return renewals

    def keep_connected(self, url: str) -> AbstractContextManager[None]:
        """Enter ``keep_connected(url)`` for the ``with`` block (Python API only)."""
        raise NotImplementedError(f"{self.name} has no keep_connected")

    def close(self) -> None:
        return None


ExitBlock = Callable[
    [type[BaseException] | None, BaseException | None, TracebackType | None], bool | None
]


class _PythonHolding(Holding):
    """Locks entered through the Python API; ``exit_block`` is their ``__exit__``."""

    def __init__(
        self,
        exit_block: ExitBlock,
        event: Any,
        token: int | None,
        lease: Any = None,
        entered: Any = None,
    ) -> None:
        self._exit_block = exit_block
        self._event = event
        self._token = token
        self.lease = lease
        self.entered = entered
        """What the ``with`` gave: the session, or the lock entered on its own."""

    def fencing_token(self) -> int | None:
        return self._token

    def lease_lost_event_set(self) -> bool | None:
        return None if self._event is None else bool(self._event.is_set())

    def release(self, error: BaseException | None = None) -> None:
        if error is None:
            self._exit_block(None, None, None)
        elif not self._exit_block(type(error), error, error.__traceback__):
            raise error


class SyncDriver(Driver):
    name = "sync"
    features = frozenset({"python-api"})

    def hold(self, context: LockContext, strategies: Sequence[str]) -> Holding:
        manager = dislock.acquire_locks(context, strategies)
        session = manager.__enter__()
        return _PythonHolding(
            manager.__exit__, session.lease_lost, session.fencing_token, session.lease, session
        )

    def hold_lock(self, kind: str, context: LockContext) -> Holding:
        lock: dislock.ScheduleLock | dislock.LeaseLock
        lock = dislock.LeaseLock(context) if kind == "lease" else dislock.ScheduleLock(context)
        lock.__enter__()
        return _PythonHolding(
            lock.__exit__, getattr(lock, "lease_lost", None), lock.fence, entered=lock
        )

    def run_with_locks(
        self, argv: Sequence[str], context: LockContext, strategies: Sequence[str]
    ) -> int:
        return dislock.run_with_locks(argv, context=context, strategies=strategies)

    def keep_connected(self, url: str) -> AbstractContextManager[None]:
        return dislock.keep_connected(url)


class AioDriver(Driver):
    """Runs the asyncio API on an event loop in a background thread."""

    name = "aio"
    features = frozenset({"python-api"})

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def hold(self, context: LockContext, strategies: Sequence[str]) -> Holding:
        manager = dislock.aio.acquire_locks(context, strategies)
        session = self.call(manager.__aenter__())
        return _PythonHolding(
            self._exit_block(manager),
            session.lease_lost,
            session.fencing_token,
            session.lease,
            session,
        )

    def hold_lock(self, kind: str, context: LockContext) -> Holding:
        lock: dislock.aio.ScheduleLock | dislock.aio.LeaseLock

        async def enter() -> None:
            await lock.__aenter__()

        # Built on the loop's thread, like an asyncio program would.
        async def build() -> dislock.aio.ScheduleLock | dislock.aio.LeaseLock:
            if kind == "lease":
                return dislock.aio.LeaseLock(context)
            return dislock.aio.ScheduleLock(context)

        lock = self.call(build())
        self.call(enter())
        lost = getattr(lock, "lease_lost", None)
        return _PythonHolding(self._exit_block(lock), lost, lock.fence, entered=lock)

    def _exit_block(self, manager: AbstractAsyncContextManager[Any]) -> ExitBlock:
        def exit_block(
            kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
        ) -> bool | None:
            return self.call(manager.__aexit__(kind, error, tb))

        return exit_block

    def run_with_locks(
        self, argv: Sequence[str], context: LockContext, strategies: Sequence[str]
    ) -> int:
        return self.call(dislock.aio.run_with_locks(argv, context=context, strategies=strategies))

    @contextmanager
    def keep_connected(self, url: str) -> Iterator[None]:
        manager = dislock.aio.keep_connected(url)
        self.call(manager.__aenter__())
        try:
            yield
        finally:
            self.call(manager.__aexit__(None, None, None))

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


class CliHolding(Holding):
    def __init__(
        self,
        process: subprocess.Popen[str],
        release_file: Path,
        watches_loss: bool,
        token_file: Path,
        stderr_file: Path,
    ) -> None:
        self._process = process
        self._release_file = release_file
        self._watches_loss = watches_loss
        self._token_file = token_file
        self._stderr_file = stderr_file

    def said(self) -> str:
        """What the wrapper has written to its stderr so far."""
        return self._stderr_file.read_text()

    def fencing_token(self) -> int | None:
        token = self._token_file.read_text().strip()
        return int(token) if token else None

    def lease_lost_event_set(self) -> bool | None:
        if not self._watches_loss:
            return None
        return self._process.poll() == LEASE_LOST_EXIT_CODE

    def release(self, error: BaseException | None = None) -> None:
        if error is not None:
            raise NotImplementedError("a wrapped command has no Python exception to propagate")
        self._release_file.write_text("0")
        status = self._process.wait(timeout=30)
        stderr = self.said()
        if status == LEASE_LOST_EXIT_CODE:
            raise LeaseLostError(stderr)
        if status != 0:
            raise RuntimeError(f"dislock exited {status}: {stderr}")


def wrapper_variables(context: LockContext) -> dict[str, str]:
    """The variables that give a wrapper ``context``'s settings (those it has a variable
    for and that are set), as text: what ``dislock.core.variables`` reads, written back."""
    written = {
        variable.name: _written(variable.field, getattr(context, variable.field))
        for variable in variables.VARIABLES
        if variable.field is not None
    }
    return {name: text for name, text in written.items() if text is not None}


def _written(field: str, value: Any) -> str | None:
    """A field's value as its variable's text; None: leave the variable unset."""
    if value is None:
        return None
    if field in ("table_parts", "history_table"):
        return ".".join(value)
    if field == "after":
        return ",".join(value) or None
    if field == "lease_loss_policy":
        return str(value.value)
    if field == "cron_tz":  # an IANA zone; a zone read from a path has none
        zone = getattr(value, "key", None)
        return zone if isinstance(zone, str) and not zone.startswith("/") else None
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


NOT_RUNNING = "dislock: not running"
"""How the wrapper's stderr starts the line that says it ran nothing (a lock held)."""


class CliDriver(Driver):
    """Runs the ``dislock`` wrapper as a subprocess, configured through its environment."""

    name = "cli"
    features = frozenset({"wrapper"})
    url_variable = "DISLOCK_TEST_DATABASE_URL"

    def __init__(self) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="dislock-cli-driver-"))
        self.hold_stderr: Path | None = None
        """The stderr of the latest ``hold``'s wrapper, written as it runs."""

    @classmethod
    def command(cls) -> list[str]:
        return [sys.executable, "-m", "dislock.cli"]

    @classmethod
    def environment(cls, context: LockContext, strategies: Sequence[str]) -> dict[str, str]:
        if context.next_run_time is not None:
            raise NotImplementedError("the CLI computes slots from CRON_SCHEDULE only")
        env = {
            **os.environ,
            cls.url_variable: context.url,
            **wrapper_variables(context),
            variables.STRATEGY.name: ",".join(strategies),
            variables.LOG_LEVEL.name: "INFO",
        }
        # A retry is left to another machine first, which the slot row tells by the
        # host that starts an owner token: with retries, the wrapper runs on the
        # machine its context's owner names, as the Python drivers' owners are
        # machines of their own.
        return on_host(env, context.owner.split(":")[0]) if context.retries else env

    def hold(self, context: LockContext, strategies: Sequence[str]) -> Holding:
        run = self._tmp / uuid.uuid4().hex
        started, release = run.with_suffix(".started"), run.with_suffix(".release")
        token, said = run.with_suffix(".token"), run.with_suffix(".hold-stderr")
        self.hold_stderr = said
        script = (
            f'echo "$DISLOCK_FENCING_TOKEN" > "{token}"; touch "{started}";'
            f' while [ ! -e "{release}" ]; do sleep 0.02; done'
        )
        with said.open("w") as stderr:  # a file, so that a test can read it as it runs
            process = subprocess.Popen(
                [*self.command(), self.url_variable, "sh", "-c", script],
                env=self.environment(context, strategies),
                stderr=stderr,
                text=True,
            )
        deadline = time.monotonic() + 30
        while not started.exists():
            if process.poll() is not None:
                _raise_for_status(process.returncode, said.read_text())
            if time.monotonic() > deadline:
                process.kill()
                raise TimeoutError("dislock did not start the command")
            time.sleep(0.01)
        watches = "lease" in strategies and context.lease_loss_policy is LeaseLossPolicy.TERMINATE
        return CliHolding(process, release, watches, token, said)

    def hold_lock(self, kind: str, context: LockContext) -> Holding:
        raise NotImplementedError("the CLI has no lock classes")

    def close(self) -> None:
        # The holdings' marker files (started, release, token, stderr), ~90 per suite run.
        shutil.rmtree(self._tmp, ignore_errors=True)

    def is_owner_token(self, value: str, context: LockContext) -> bool:
        # The wrapper makes its own token: hostname:pid:nonce (the host of ``environment``).
        host = context.owner.split(":")[0] if context.retries else socket.gethostname()
        return re.fullmatch(rf"{re.escape(host)}:\d+:[0-9a-f]{{8}}", value) is not None

    def start(
        self,
        argv: Sequence[str],
        context: LockContext,
        strategies: Sequence[str],
        extra_env: dict[str, str] | None = None,
    ) -> subprocess.Popen[str]:
        """The wrapper running ``argv``, with ``extra_env`` on top of the context's
        variables (e.g. ``LOCK_CONFLICT_EXIT_CODE``), its stderr piped."""
        return subprocess.Popen(
            [*self.command(), self.url_variable, *argv],
            env={**self.environment(context, strategies), **(extra_env or {})},
            stderr=subprocess.PIPE,
            text=True,
        )

    def run_with_locks(
        self, argv: Sequence[str], context: LockContext, strategies: Sequence[str]
    ) -> int:
        # Its stderr goes to a file as it runs, so that a test can see what the
        # wrapper has said so far (``stderr_logs``): that it waits, for one.
        log = self._tmp / f"{uuid.uuid4().hex}.stderr"
        with log.open("w") as stderr:
            result = subprocess.run(
                [*self.command(), self.url_variable, *argv],
                env=self.environment(context, strategies),
                stderr=stderr,
                timeout=60,
                check=False,
            )
        said = log.read_text()
        if result.returncode == 0 and NOT_RUNNING in said:
            raise LockNotAcquiredError(said)
        if result.returncode in (1, 2):
            _raise_for_status(result.returncode, said)
        return result.returncode

    def stderr_logs(self) -> set[Path]:
        """The stderr of every ``run_with_locks`` so far, each written as it runs."""
        return set(self._tmp.glob("*.stderr"))


def _raise_for_status(status: int, stderr: str) -> None:
    if status == 0:
        raise LockNotAcquiredError(stderr)
    if status == 2:
        raise ConfigurationError(stderr)
    raise RuntimeError(f"dislock exited {status}: {stderr}")
