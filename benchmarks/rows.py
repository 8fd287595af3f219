"""A row of the benchmark table: the numbers a measure took, and how they read.

The result column is not stored as text: it is ``template`` formatted with
``numbers``, so that the plot (and anything else) reads the measured numbers
themselves instead of parsing them back out of the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Number = float | int | str
"""What a row measured: a time, a ratio, a count, or a word (``yes``, an error)."""


@dataclass(frozen=True)
class Row:
    """A measure's line: its wording, result, target and verdict (``met``, ``missed``,
    ``MISSED`` for a correctness failure, or empty for a number only reported)."""

    measure: str
    template: str
    """The result column, written with ``str.format`` from ``numbers``."""
    target: str
    verdict: str = ""
    numbers: Mapping[str, Number] = field(default_factory=dict)
    key: str = ""
    """How a reader of the rows (the plot) finds this one, whatever its wording."""

    @property
    def result(self) -> str:
        return self.template.format_map(self.numbers)


def met(passed: bool, missed: str = "missed") -> str:
    """The verdict of a target: ``met``, or the word for a miss (``MISSED`` where
    the miss is a correctness failure, not a slow run)."""
    return "met" if passed else missed
