"""How long the shells give a statement, a cancellation or a stopping worker: bounds
of I/O, not of the lease (``dislock.core.lease_clock``)."""

from __future__ import annotations

RENEWER_STOP_TIMEOUT = 3.0
"""Seconds a lock waits for its renewer to stop on exit."""

CANCEL_GRACE = 1.0
"""Seconds a cancelled statement gets to end before it is given up on (the cancel
request can be lost on a dead network as well)."""

STATEMENT_FLOOR = 0.05
"""A statement sent late (after waiting for the shared connection) still gets this long."""

STUCK_AFTER = 0.1
"""A statement still running this long after its cancellation was sent makes its
connection suspect: further statements go to a new connection rather than queue
behind it (a live server ends a cancelled statement within milliseconds)."""

RELEASE_TIMEOUT = 2.0
"""Seconds the release on exit may take before it is cancelled (the row then
expires by itself)."""
