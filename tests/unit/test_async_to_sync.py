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
if True:  # ASYNC
    from collections.abc import Awaitable


def f():
    if True:  # ASYNC
        note = "async only"

        more = 1
    try:
        return go()
    except Exception:
        raise
    if True:  # ASYNC
        a = 1
    else:
        # the sync flavour's
        a = 2

        b = [
            3,
        ]
    return a
"""

SYNC = """\


def f():
    try:
        return go()
    except Exception:
        raise
    # the sync flavour's
    a = 2

    b = [
        3,
    ]
    return a
"""


def test_blocks_select_the_sync_flavour(tool: ModuleType) -> None:
    assert tool.select_blocks(SOURCE) == SYNC


def test_text_without_blocks_is_kept(tool: ModuleType) -> None:
    text = "if True:\n    x = 1\nelse:\n    x = 2\n"
    assert tool.select_blocks(text) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("if True:  # ASYNC\n    if True:  # ASYNC\n        x = 1\n", "do not nest"),
        ("if True:  # ASYNC\nx = 1\n", "no body"),
        ("if True:  # ASYNC\n    x = 1\nelse:\ny = 2\n", "no body"),
    ],
)
def test_misplaced_blocks_are_refused(tool: ModuleType, text: str, message: str) -> None:
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
