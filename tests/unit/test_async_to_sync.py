"""The generator's flavour blocks and its asyncio-wording check (tools/async_to_sync.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "async_to_sync.py"


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("async_to_sync", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("async_to_sync", module)
    spec.loader.exec_module(module)
    return module


SOURCE = """\
def f():
    # if async
    note = "async only"
    # endif
    try:
        return go()
    # if sync
    # except NotSent:
    #     # retried
    #
    #     return go()
    # endif
    except Exception:
        raise
    # if async
    a = 1
    # else
    # a = 2
    # endif
"""

SYNC = """\
def f():
    try:
        return go()
    except NotSent:
        # retried

        return go()
    except Exception:
        raise
    a = 2
"""


def test_blocks_select_the_sync_flavour(tool: ModuleType) -> None:
    assert tool.select_blocks(SOURCE) == SYNC


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("# if sync\n# if async\n# endif\n", "do not nest"),
        ("# endif\n", "without '# if'"),
        ("# if sync\n# else\n# endif\n", "only follows '# if async'"),
        ("# if async\nx = 1\n", "never closed"),
        ("    # if sync\n    x = 1\n    # endif\n", "must start with"),
    ],
)
def test_misplaced_markers_are_refused(tool: ModuleType, text: str, message: str) -> None:
    with pytest.raises(tool.BlockError, match=message):
        tool.select_blocks(text)


def test_asyncio_wording_is_found_after_the_header(tool: ModuleType) -> None:
    text = '# GENERATED from asyncio\n"""Runs on the event loop."""\nx = 1  # fine\n'
    assert tool.asyncio_wording(text, skip=1) == ['2: """Runs on the event loop."""']
    assert tool.asyncio_wording('"""A thread renews the leases."""\n', skip=0) == []


def test_the_generated_modules_speak_no_asyncio(tool: ModuleType) -> None:
    for name in tool.MODULES:
        text = (tool.TARGET_DIR / name).read_text()
        assert tool.asyncio_wording(text, skip=2) == [], name
