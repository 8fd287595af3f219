"""The README's quick start: two commands on a fresh machine, the demo and the quick check
(``hatch test tests/unit``, with its time), both of which CI runs as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_quick_start_is_the_demo_and_the_quick_check_with_its_time() -> None:
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"^## Quick start\n.*?^```bash\n(.*?)^```", readme, re.S | re.M)
    assert found is not None, "README.md has no quick start block"
    commands = [line.split("#")[0].strip() for line in found.group(1).splitlines()]
    assert commands == ["hatch run demo", "hatch test tests/unit"]
    # Named the quick check, with its time, there and under Development.
    times = re.findall(r"^hatch test tests/unit +#.*quick check.*~(\d+ s)\)?$", readme, re.M)
    assert len(times) == 2 and len(set(times)) == 1, times


def test_ci_runs_the_quick_start_as_written() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^hatch run demo$", ci, re.M)
    assert re.search(r"^hatch test tests/unit$", ci, re.M)
