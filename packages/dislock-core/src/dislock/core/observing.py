"""Notes on a run's course (a wait, a lock taken, the command started, a lost lease, a
signal sent) for whoever observes it: the ``dislock`` wrapper's trace span
(``dislock.cli.wrapper.tracing``).  Nobody by default, and then a note costs a lookup.

The observer is a context variable, set around one run (``observed``): two runs of one
event loop keep theirs apart.  Notes come from the run's own flow, never the renewer's
thread (a thread starts with no observer)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

Value = str | int | float


class Observer(Protocol):
    def note(self, event: str, attributes: dict[str, Value]) -> None:
        """``event`` (``wait``, ``acquired``, ``started``, ``lease_lost``, ``kill``) happened."""


_observer: ContextVar[Observer | None] = ContextVar("dislock_observer", default=None)


def note(event: str, **attributes: Value | None) -> None:
    """Tell the run's observer, if it has one, that ``event`` happened (with the
    ``attributes`` that are not None)."""
    observer = _observer.get()
    if observer is not None:
        observer.note(
            event, {name: value for name, value in attributes.items() if value is not None}
        )


@contextmanager
def observed(observer: Observer) -> Iterator[None]:
    """``observer`` is told the notes of what runs within."""
    token = _observer.set(observer)
    try:
        yield
    finally:
        _observer.reset(token)
