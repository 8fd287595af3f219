#!/usr/bin/env python3
"""Generate the sync lock modules from their asyncio sources.

The asyncio modules in ``packages/dislock-aio/src/dislock/aio`` are the only
hand-written copy of the lock and supervisor logic.  This tool drops
``async``/``await`` and renames the few asyncio-only names, token by token (so
strings and comments are left alone), then formats the result with ruff:

    python tools/async_to_sync.py          # rewrite the generated files
    python tools/async_to_sync.py --check  # exit 1 if any is stale (CI)

Concurrency primitives whose sync and async forms differ in more than keywords
live in each package's hand-written ``_compat.py`` under the same names.
"""

from __future__ import annotations

import argparse
import difflib
import io
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIR = ROOT / "packages/dislock-aio/src/dislock/aio"
TARGET_DIR = ROOT / "packages/dislock/src/dislock/_sync"
MODULES = ("_hub.py", "_locks.py", "_supervisor.py")

RENAMES = {
    "AsyncConnection": "Connection",
    "AsyncCursor": "Cursor",
    "AsyncExitStack": "ExitStack",
    "AsyncIterator": "Iterator",
    "asynccontextmanager": "contextmanager",
    "enter_async_context": "enter_context",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
}
DROPPED = {"async", "await"}


def header(source: Path) -> str:
    relative = source.relative_to(SOURCE_DIR.parent.parent).as_posix()
    return (
        f"# GENERATED from dislock-aio's {relative} by tools/async_to_sync.py: do not edit.\n"
        "# Change the asyncio source, then run `hatch run generate`.\n"
    )


def unasync(text: str) -> str:
    """``text`` with async keywords dropped and asyncio names renamed."""
    lines = text.splitlines(keepends=True)
    # (row, col, end_col, replacement), applied right to left within each line.
    edits: list[tuple[int, int, int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type != tokenize.NAME:
            continue
        (row, col), (_, end_col) = token.start, token.end
        if token.string in DROPPED:
            line = lines[row - 1]
            # Take the keyword's trailing space with it.
            while end_col < len(line) and line[end_col] == " ":
                end_col += 1
            edits.append((row, col, end_col, ""))
        elif token.string in RENAMES:
            edits.append((row, col, end_col, RENAMES[token.string]))
    for row, col, end_col, replacement in sorted(edits, reverse=True):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + replacement + line[end_col:]
    return "".join(lines)


def ruff(args: list[str], text: str, filename: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(filename), "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"ruff {args[0]} failed on {filename}: {result.stderr.strip()}")
    return result.stdout


def ruff_format(text: str, filename: Path) -> str:
    # Renames can unsort imports and dropped keywords can shorten lines.
    isort = ["check", "--select", "I", "--fix", "--quiet", "--exit-zero"]
    sorted_imports = ruff(isort, text, filename)
    return ruff(["format"], sorted_imports, filename)


def generate(source: Path, target: Path) -> str:
    body = unasync(source.read_text())
    return ruff_format(header(source) + body, target)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if generated files are stale")
    args = parser.parse_args()
    stale = 0
    for name in MODULES:
        source, target = SOURCE_DIR / name, TARGET_DIR / name
        wanted = generate(source, target)
        current = target.read_text() if target.exists() else ""
        if wanted == current:
            continue
        if args.check:
            stale += 1
            sys.stdout.writelines(
                difflib.unified_diff(
                    current.splitlines(keepends=True),
                    wanted.splitlines(keepends=True),
                    str(target.relative_to(ROOT)),
                    "generated",
                )
            )
        else:
            target.write_text(wanted)
            print(f"wrote {target.relative_to(ROOT)}")
    if stale:
        print(f"{stale} generated module(s) are stale: run `hatch run generate`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
