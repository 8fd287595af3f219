"""The README's one-line decorator, extracted from README.md and run as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from dislock import LockNotAcquiredError

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_block(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (block,) = [block for block in blocks if marker in block]
    return str(block)


def test_the_readme_decorator_runs_once_per_slot(
    database_url: str, lock_table: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The block's unqualified key_value resolves to this test's own table.
    params = conninfo_to_dict(database_url)
    params["options"] = f"-c search_path={lock_table[0]}"
    monkeypatch.setenv("DATABASE_URL", make_conninfo("", **params))
    sent: list[str] = []
    namespace: dict[str, Any] = {"send_digest": lambda: sent.append("sent")}
    exec(compile(readme_block("@with_locks("), str(README), "exec"), namespace)

    namespace["daily_digest"]()
    with pytest.raises(LockNotAcquiredError):
        namespace["daily_digest"]()  # another replica, the same slot
    assert sent == ["sent"]
