# GENERATED from dislock-aio's dislock/aio/_decorators.py by tools/async_to_sync.py: do not edit.
# Change the asyncio source, then run `hatch run generate`.
"""Decorators: ``with_locks`` (the short form, and 0.1.0's), and its
``skip_held`` variant for jobs scheduled on every replica."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from functools import wraps
from typing import Any, Literal, ParamSpec, TypeVar, overload

from dislock.core.context import LockContext, strategies_for
from dislock.core.errors import ConfigurationError, LockDelayedError, LockNotAcquiredError

from ._compat import Gives, Takes
from ._session import Acquisition, enter_exit_first

logger = logging.getLogger("dislock")

P = ParamSpec("P")
R = TypeVar("R")


class _SkipWhenHeld:
    """``with_locks(..., skip_held=True)``: a decorator whose calls, when another
    owner holds a lock, do nothing and return None instead of raising, as a
    scheduler's job on every replica but one should.  Only the acquisition's own
    refusal is swallowed, never an error of the function's."""

    def __init__(self, acquisition: Acquisition) -> None:
        self._acquisition = acquisition

    def __call__(self, func: Takes[P, R]) -> Gives[P, R | None]:
        @wraps(func)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R | None:
            with ExitStack() as stack:
                try:
                    enter_exit_first(stack, self._acquisition.for_one_call())
                except LockNotAcquiredError as refused:
                    _skipped(func, refused)
                    return None
                return func(*args, **kwargs)

        return guarded


def _skipped(func: Callable[..., object], refused: LockNotAcquiredError) -> None:
    # A lock delay holds up every key of the table, not just this one: say it louder.
    level = logging.WARNING if isinstance(refused, LockDelayedError) else logging.INFO
    logger.log(level, "skipped %s: %s", getattr(func, "__qualname__", func), refused)


@overload
def with_locks(
    context: LockContext | str,
    strategies: str | Iterable[str] | None = None,
    *,
    skip_held: Literal[False] = False,
    **settings: Any,
) -> Acquisition: ...


@overload
def with_locks(
    context: LockContext | str,
    strategies: str | Iterable[str] | None = None,
    *,
    skip_held: Literal[True],
    **settings: Any,
) -> _SkipWhenHeld: ...


def with_locks(
    context: LockContext | str,
    strategies: str | Iterable[str] | None = None,
    *,
    skip_held: bool = False,
    **settings: Any,
) -> Acquisition | _SkipWhenHeld:
    """Decorate a function so that each call runs only while its locks are held.

    The 0.1.0 form, ``@with_locks(context, strategies)``, is
    ``@acquire_locks(context, strategies)``.  The short form names the key and
    the ``LockContext`` fields that differ from the defaults (url from
    ``$DATABASE_URL``, table ``key_value``):
    ``@with_locks("nightly-report", schedule="0 3 * * *")``.  Without
    ``strategies``, the locks follow the settings: a schedule slot with
    ``schedule`` (or ``next_run_time``), a lease with ``run_ttl_seconds``, both
    with both.  The short form makes a new owner token for each call (unless
    ``owner`` is given), so that processes forked after decorating never share
    one.  A call whose lock is held elsewhere raises ``LockNotAcquiredError``;
    with ``skip_held=True`` it returns None instead (logged at INFO, a lock delay
    at WARNING), which is what a job scheduled on every replica wants.
    """
    fresh_owner = isinstance(context, str) and "owner" not in settings
    if isinstance(context, str):
        # Built now, so that a mistake fails as the function is decorated.
        context = LockContext(lock_key=context, **settings)
    elif settings:
        raise ConfigurationError(
            f"with_locks(context, ...) takes no settings ({', '.join(sorted(settings))}): "
            "they belong in the LockContext"
        )
    chosen = strategies_for(context) if strategies is None else strategies
    acquisition = Acquisition(context, chosen, fresh_owner=fresh_owner)
    return _SkipWhenHeld(acquisition) if skip_held else acquisition
