"""A run's row in the history table (``LockContext.history``): inserted once its
locks are held, completed as the block ends, before they are released.

The statements, and what an ending counts as, are ``dislock.core.history``'s.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from datetime import datetime, timezone
from time import monotonic
from typing import Any, Protocol

from dislock.core import after, history
from dislock.core.after import DependencyPending
from dislock.core.context import LEASE_LOST_EXIT_CODE, LeaseLossPolicy, LockContext
from dislock.core.dsn import message_line, one_line, scrub
from dislock.core.exit_arguments import Exc, ExcType, Tb
from dislock.core.lease_state import LeaseState
from dislock.core.patience import ConnectPatience
from dislock.core.slot_context import last_success

from ._hub import Hub, enter_hub, leave_hub

logger = logging.getLogger("dislock")


class Run(Protocol):
    """What the row's end needs of the run: whether its lease was lost, and how it
    ended when ``run_with_locks`` says so (``LockSession``)."""

    @property
    def lease(self) -> LeaseState[Any, Any] | None: ...

    @property
    def run_end(self) -> history.RunEnd | None: ...


def run_end(context: LockContext, run: Run, exc: BaseException | None) -> history.RunEnd:
    """How ``run`` ended, as its history row and its slot's retries count it: as
    ``run_with_locks`` said, else judged from the block's exception ``exc``."""
    lease = run.lease
    lost = lease is not None and lease.is_lost()
    end = run.run_end
    if end is None:
        return history.end_of_block(exc, lease_lost=lost)
    if lost and end.outcome == "ok" and context.lease_loss_policy is LeaseLossPolicy.TERMINATE:
        # The lease went as the command ended: the wrapper returns 75.
        return end._replace(outcome="lease_lost", exit_code=LEASE_LOST_EXIT_CODE)
    if end.outcome == "ok":
        return end._replace(stdout_tail=None, stderr_tail=None)  # a success keeps no output
    return end


class Alone:
    """The run of a lock entered by itself, without ``acquire_locks``."""

    def __init__(self, lease: LeaseState[Any, Any] | None) -> None:
        self.lease = lease
        self.run_end: history.RunEnd | None = None


class RunRecording:
    """The run's row: inserted as it is entered, completed as it is left.  It keeps
    the shared connection for the end statement, so that a schedule-only run does not
    connect again to record it.  A history statement that fails is logged and
    otherwise ignored: the run is not the history's hostage."""

    def __init__(
        self, context: LockContext, run: Run, modes: Sequence[str], slot_end: datetime | None
    ) -> None:
        self.context = context
        self.run = run
        self.modes = list(modes)
        self.slot_end = slot_end
        self.table = history.history_table(context.table_parts, context.history_table)
        self.run_id: int | None = None
        self.last_success: datetime | None = None
        """The start of the key's last successful run before this one (None: none)."""
        self.hub: Hub | None = None

    async def __aenter__(self) -> RunRecording:
        context = self.context
        self.hub = enter_hub(context.url, context.connect_timeout_seconds)
        start = history.start(
            self.table,
            lock_key=context.lock_key,
            modes=self.modes,
            slot_end=self.slot_end,
            owner=context.owner,
            host=socket.gethostname(),
            pid=os.getpid(),
            cron=context.schedule,
            cron_tz=None if context.cron_zone is None else context.cron_zone.name,
        )
        try:
            started = await self.hub.ask(start, history.HISTORY_TIMEOUT)
            self.run_id = started.run_id
            self.last_success = last_success(context, started)
            await self._record_kept_ends(self.hub)
        except Exception as exc:
            logger.warning(
                "could not record the start of %r in history table %s: %s%s",
                context.lock_key,
                ".".join(self.table),
                message_line(exc, context.url),
                " (dislockctl init --history creates it)" if history.missing_table(exc) else "",
            )
        except BaseException:  # interrupted: nothing left for the exit to do
            hub, self.hub = self.hub, None
            await leave_hub(hub)
            raise
        return self

    async def _record_kept_ends(self, hub: Hub) -> None:
        """Record the ends of earlier runs on this host that the database could not
        take (``dislock.core.unrecorded``): its start is in, so it answers."""
        from dislock.core import unrecorded

        for path, kept in unrecorded.kept_ends(self.context.url, self.table):
            try:
                ending = history.late_end(kept.table, kept.run_id, kept.end, kept.ended_at)
                await hub.ask(ending, history.HISTORY_TIMEOUT)
            except Exception as exc:  # tried again by the next run
                logger.debug("could not record a kept end (%s): %s", path.name, exc)
                return
            unrecorded.forget(path)
            logger.info(
                "recorded the end of run %d (%s at %s), which this host had kept",
                kept.run_id,
                kept.end.outcome,
                kept.ended_at.isoformat(timespec="seconds"),
            )

    @property
    def holding(self) -> bool:
        """Whether it uses the shared connection (from entering until its exit)."""
        return self.hub is not None

    async def __aexit__(self, exc_type: ExcType, exc: Exc, tb: Tb) -> None:
        hub, self.hub = self.hub, None
        assert hub is not None
        try:
            if self.run_id is not None:
                await self._record_end_of(hub, self.run_id, run_end(self.context, self.run, exc))
        finally:
            await leave_hub(hub)

    async def _record_end_of(self, hub: Hub, run_id: int, end: history.RunEnd) -> None:
        ending = history.end(self.table, run_id, end)
        ended_at = datetime.now(timezone.utc)
        try:
            await hub.ask(ending, history.HISTORY_TIMEOUT)
        except Exception as error:
            if end.has_tail and history.without_tail(error):
                logger.warning(
                    "the history table %s has no column for the output's tail, or this role may"
                    " not write it (run dislockctl init --history again, and grant again): %s;"
                    " recording the end of %s without it",
                    ".".join(self.table),
                    scrub(one_line(str(error)), self.context.url),
                    self.context.lock_key,
                )
                await self._record_end_of(
                    hub, run_id, end._replace(stdout_tail=None, stderr_tail=None)
                )
                return
            if not (history.retry_end(error) and self.context.connect_patience_seconds > 0):
                self._not_recorded(error, run_id, end, ended_at)
                return
            logger.warning(
                "could not record the end of %s yet (%s); retrying for up to %g s",
                self.context.lock_key,
                scrub(one_line(str(error)), self.context.url),
                self.context.connect_patience_seconds,
            )
            try:
                patience = ConnectPatience(self.context.connect_patience_seconds, monotonic())
                await hub.connect(patience)
                await hub.ask(ending, history.HISTORY_TIMEOUT, patience)
            except Exception as again:
                self._not_recorded(again, run_id, end, ended_at)
                return
            logger.warning("recorded the end of %s: %s", self.context.lock_key, end.outcome)

    def _not_recorded(
        self, error: BaseException, run_id: int, end: history.RunEnd, ended_at: datetime
    ) -> None:
        """Say so, and keep the end on this host for a later run to record, when the
        database was away (another refusal would refuse it again)."""
        from dislock.core import unrecorded

        context = self.context
        kept = ""
        if history.retry_end(error):
            try:
                path = unrecorded.keep(
                    context.url, unrecorded.KeptEnd(self.table, run_id, end, ended_at)
                )
            except OSError as exc:
                kept = f"; could not keep it on this host either ({exc.strerror})"
            else:
                kept = f"; kept in {path}, for the next run with history on this host to record"
        logger.warning(
            "could not record the end of %s in history table %s: %s%s",
            context.lock_key,
            ".".join(self.table),
            scrub(one_line(str(error)), context.url),
            kept,
        )


async def record_late(context: LockContext, slot_end: datetime) -> None:
    """Record the slot ending at ``slot_end`` as ``late``: its start deadline had
    passed before anyone started it, and this acquisition marked it so."""
    run = Alone(None)
    run.run_end = history.RunEnd("late")
    async with RunRecording(context, run, ("schedule",), slot_end):
        pass


async def record_held_back(context: LockContext, pending: DependencyPending) -> None:
    """Record the slot ``pending`` refused as held back by the key it names, unless
    the slot has such a row already (``dislock.core.after``); a failure is
    logged, never raised."""
    if pending.slot_start is None or pending.slot_end is None:
        return
    table = history.history_table(context.table_parts, context.history_table)
    start = after.record_start(
        table,
        lock_key=context.lock_key,
        key=pending.key,
        slot_start=pending.slot_start,
        slot_end=pending.slot_end,
        host=socket.gethostname(),
        pid=os.getpid(),
        cron=context.schedule,
        cron_tz=None if context.cron_zone is None else context.cron_zone.name,
    )
    hub = enter_hub(context.url, context.connect_timeout_seconds)
    try:
        run_id = await hub.ask(start, history.HISTORY_TIMEOUT)
        if run_id is None:
            return  # recorded by an earlier refusal in the slot
        try:
            await hub.ask(after.record_end(table, run_id), history.HISTORY_TIMEOUT)
        except Exception as exc:
            if not after.refused(exc):
                raise
            logger.warning(
                "this role may not record a slot held back (granted before it: grant it"
                " again); marking the slot of %r late instead",
                context.lock_key,
            )
            ending = after.record_end(table, run_id, after.LATE_FALLBACK)
            await hub.ask(ending, history.HISTORY_TIMEOUT)
    except Exception as exc:
        logger.warning(
            "could not record that a slot of %r is held back in history table %s: %s",
            context.lock_key,
            ".".join(table),
            message_line(exc, context.url),
        )
    finally:
        await leave_hub(hub)
