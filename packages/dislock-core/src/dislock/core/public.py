"""dislock's core public names (``dislock._CORE_NAMES``), gathered from the modules that
define them: ``from dislock.core.public import *`` gives them, and only them (no ``__all__``:
every name here is one; ``tests/unit/test_namespace.py`` holds them to that list)."""

from dislock.core.context import LEASE_LOST_EXIT_CODE as LEASE_LOST_EXIT_CODE
from dislock.core.context import MAX_RUNTIME_EXIT_CODE as MAX_RUNTIME_EXIT_CODE
from dislock.core.context import LeaseLossPolicy as LeaseLossPolicy
from dislock.core.context import LockContext as LockContext
from dislock.core.errors import ConfigurationError as ConfigurationError
from dislock.core.errors import DatabaseUnreachableError as DatabaseUnreachableError
from dislock.core.errors import DislockError as DislockError
from dislock.core.errors import KeyNotGrantedError as KeyNotGrantedError
from dislock.core.errors import LeaseLostError as LeaseLostError
from dislock.core.errors import LockDelayedError as LockDelayedError
from dislock.core.errors import LockNotAcquiredError as LockNotAcquiredError
from dislock.core.errors import LockPausedError as LockPausedError
from dislock.core.errors import MaxRuntimeExceeded as MaxRuntimeExceeded
from dislock.core.errors import NotReplicatedError as NotReplicatedError
from dislock.core.errors import SlotLateError as SlotLateError
from dislock.core.errors import StatementTimeout as StatementTimeout
