"""How a ``with`` block ended, as its exit method is told: the three types of
``__exit__``'s arguments (all None when the block ended normally), written once
for every context manager of both flavours."""

from __future__ import annotations

from types import TracebackType
from typing import TypeAlias

ExcType: TypeAlias = type[BaseException] | None
Exc: TypeAlias = BaseException | None
Tb: TypeAlias = TracebackType | None
