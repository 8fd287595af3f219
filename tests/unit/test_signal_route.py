"""Where a wrapped run's forwarded signals go, phase by phase (``SignalRoute``)."""

from __future__ import annotations

import signal

from dislock.core.supervision import SignalAction, SignalRoute

TERM, INT, HUP = signal.SIGTERM, signal.SIGINT, signal.SIGHUP


def test_while_the_locks_are_taken_the_first_signal_interrupts_and_later_ones_are_dropped() -> None:
    route = SignalRoute()
    assert route.arrived(INT) is SignalAction.INTERRUPT
    assert route.arrived(TERM) is SignalAction.DROP
    assert route.fired == INT


def test_signals_between_the_locks_and_the_command_are_kept_in_order_for_it() -> None:
    route = SignalRoute()
    route.locks_held()
    assert route.arrived(HUP) is SignalAction.KEEP
    assert route.arrived(TERM) is SignalAction.KEEP
    assert route.fired is None
    assert route.started(4242) == [HUP, TERM]
    assert route.group == 4242
    assert route.arrived(INT) is SignalAction.FORWARD
    assert route.started(4242) == []  # nothing kept twice


def test_once_the_command_has_ended_signals_are_dropped() -> None:
    route = SignalRoute()
    route.locks_held()
    route.started(4242)
    route.ended()
    assert route.group is None
    assert route.arrived(TERM) is SignalAction.DROP
    route.locks_held()  # a late call from an unwinding block changes nothing
    assert route.arrived(TERM) is SignalAction.DROP


def test_a_command_that_never_started_drops_what_was_kept() -> None:
    route = SignalRoute()
    route.locks_held()
    route.arrived(TERM)
    route.ended()
    assert route.arrived(INT) is SignalAction.DROP
    assert route.started(77) == []  # the kept TERM was for a command that did not run
