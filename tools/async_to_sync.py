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

Code that only one flavour needs is live code in the asyncio source, in
psycopg's form, so that ruff, mypy and renames see both branches:

    if True:  # ASYNC
        ...asyncio-only code: dropped from the sync module...
    else:
        ...sync-only code: the sync module gets it, one level less indented...

The ``else:`` is optional (an asyncio-only block).  In the asyncio module the
``else:`` branch never runs; mypy still resolves its names there (its types are
checked in the generated module, where it is the only branch).  Blocks do not
nest.  Where both flavours can run the same code, write it once instead (an
``except`` clause that one flavour never reaches costs nothing).

The generated modules become the sync API pages, so they must not speak of
asyncio: generation fails if one of ``ASYNC_WORDS`` is left in them (keep
docstrings flavour-neutral, or put asyncio-only remarks in an async-only block).
"""

from __future__ import annotations

import argparse
import difflib
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIR = ROOT / "packages/dislock-aio/src/dislock/aio"
TARGET_DIR = ROOT / "packages/dislock/src/dislock/_sync"
MODULES = (
    "_decorators.py",
    "_fencing.py",
    "_hub.py",
    "_lease.py",
    "_recording.py",
    "_renewer.py",
    "_schedule.py",
    "_session.py",
    "_supervisor.py",
    "_waiting.py",
    "_watching.py",
)

RENAMES = {
    "AbstractAsyncContextManager": "AbstractContextManager",
    "AsyncConnection": "Connection",
    "AsyncCursor": "Cursor",
    "AsyncExitStack": "ExitStack",
    "AsyncIterator": "Iterator",
    "asynccontextmanager": "contextmanager",
    "enter_async_context": "enter_context",
    "push_async_exit": "push",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
}
DROPPED = {"async", "await"}
ASYNC_WORDS = re.compile(r"\basyncio\b|\bevent loop\b|\bcoroutines?\b|\basync\b|\bawait\b", re.I)
ASYNC_IF = re.compile(r"^(?P<indent>[ \t]*)if True:  # ASYNC[ \t]*$")


class BlockError(ValueError):
    """A misplaced ``if True:  # ASYNC`` block."""


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _body(lines: list[str], start: int, indent: int, where: str) -> int:
    """The index after the block body that begins at ``lines[start]``: every line
    indented deeper than ``indent``, and the blank lines among them."""
    end = start
    for index in range(start, len(lines)):
        line = lines[index]
        if not line.strip():
            continue
        if _indent(line) <= indent:
            break
        if ASYNC_IF.match(line.rstrip("\n")):
            raise BlockError(f"{where}: blocks do not nest (line {index + 1})")
        end = index + 1
    if end == start:
        raise BlockError(f"{where}: the block has no body")
    return end


def _dedent(lines: list[str], by: int, where: str) -> list[str]:
    out = []
    for line in lines:
        if line.strip() and not line[:by].isspace():
            raise BlockError(f"{where}: a line of the else branch is not indented")
        out.append(line[by:] if line.strip() else line)
    return out


def select_blocks(text: str, name: str = "<source>") -> str:
    """``text`` for the sync flavour: each ``if True:  # ASYNC`` block replaced by
    its ``else:`` branch, dedented (or by nothing)."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        found = ASYNC_IF.match(line.rstrip("\n"))
        if found is None:
            out.append(line)
            index += 1
            continue
        where, indent = f"{name}:{index + 1}", len(found["indent"])
        index = _body(lines, index + 1, indent, where)
        following = index
        while following < len(lines) and not lines[following].strip():
            following += 1
        if following < len(lines) and lines[following].rstrip() == found["indent"] + "else:":
            end = _body(lines, following + 1, indent, where)
            branch = lines[following + 1 : end]
            first = next(line for line in branch if line.strip())
            out += _dedent(branch, _indent(first) - indent, where)
            index = end
    return "".join(out)


def asyncio_wording(text: str, skip: int) -> list[str]:
    """Lines of a generated module, after its ``skip`` header lines, that still
    speak of asyncio."""
    return [
        f"{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        if number > skip and ASYNC_WORDS.search(line)
    ]


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
    try:
        selected = select_blocks(source.read_text(), str(source.relative_to(ROOT)))
    except BlockError as exc:
        raise SystemExit(str(exc)) from None
    top = header(source)
    text = ruff_format(top + unasync(selected), target)
    wording = asyncio_wording(text, skip=top.count("\n"))
    if wording:
        raise SystemExit(
            f"{target.relative_to(ROOT)} would speak of asyncio (make the source's wording"
            " flavour-neutral, or put it in an async-only block):\n  " + "\n  ".join(wording)
        )
    return text


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
