"""A block that two pages show is the same on both: the retries-and-deadlines crontab is
docs/getting-started.md's and docs/operator.md's, and only the guide's runs under the real cron
(``tests/cli/test_readme_crontab.py``), so the other must not drift from it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def crontab_after(page: Path, heading: str) -> str:
    text = page.read_text()
    found = re.search(rf"^{re.escape(heading)}\n.*?^```crontab\n(.*?)^```", text, re.S | re.M)
    assert found is not None, f"{page.name} has no crontab block under {heading!r}"
    return found.group(1)


def test_the_operator_guide_shows_getting_starteds_retries_crontab() -> None:
    guide = crontab_after(ROOT / "docs" / "getting-started.md", "## 5. Retries and a deadline")
    assert "LOCK_RETRIES=" in guide and "LOCK_START_DEADLINE_SECONDS=" in guide
    assert crontab_after(ROOT / "docs" / "operator.md", "## Retries and deadlines") == guide
