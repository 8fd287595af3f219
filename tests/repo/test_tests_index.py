"""tests/README.md, the index of the tests, stays true: it names every test folder
and every file in them, names nothing that is gone, and the contract suite's
top-level files hold only tests that run on every implementation."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
INDEX = TESTS / "README.md"
NAMED = re.compile(r"`([\w/]+(?:\.py|/))`")
"""A path the index names: in backquotes, relative to tests/ (``cli/test_waiting.py``,
``contract/``)."""


def on_disk() -> set[str]:
    """Every folder below tests/ that holds Python files, and every Python file in
    them (package markers and caches aside), as the index writes them."""
    found: set[str] = set()
    for path in TESTS.rglob("*.py"):
        relative = path.relative_to(TESTS)
        if "__pycache__" in relative.parts or path.name == "__init__.py":
            continue
        if len(relative.parts) == 1:
            found.add(relative.as_posix())
            continue
        found.add(relative.as_posix())
        for depth in range(1, len(relative.parts)):
            found.add("/".join(relative.parts[:depth]) + "/")
    return found


def indexed() -> set[str]:
    return set(NAMED.findall(INDEX.read_text()))


def test_the_index_names_every_test_folder_and_file() -> None:
    missing = sorted(on_disk() - indexed())
    assert not missing, f"tests/README.md does not name: {missing}"


def test_the_index_names_nothing_that_is_gone() -> None:
    gone = sorted(name for name in indexed() if not (TESTS / name).exists())
    assert not gone, f"tests/README.md names what does not exist: {gone}"


DRIVERS = {"SyncDriver", "AioDriver", "CliDriver"}


def takes_a_driver(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the test is given the ``driver`` fixture, or builds every driver
    itself (a test that compares the implementations within one run)."""
    if any(argument.arg == "driver" for argument in function.args.args):
        return True
    named = {node.id for node in ast.walk(function) if isinstance(node, ast.Name)}
    return named >= DRIVERS


def test_each_top_level_contract_test_runs_on_every_implementation() -> None:
    """A test in ``contract/test_*.py`` takes the ``driver`` fixture, so that it is
    generated for each implementation that can express it (README.md says so); a
    test of one implementation's API belongs in ``contract/one_implementation/``."""
    alone: list[str] = []
    for path in sorted((TESTS / "contract").glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if node.name.startswith("test") and not takes_a_driver(node):
                alone.append(f"{path.name}::{node.name}")
    assert not alone, f"contract tests that take no driver: {alone}"
