"""A small mutation probe: how many one-token changes to a module the unit tests
notice.

Each mutant flips one comparison (< <= > >= == !=), one ``+``/``-``, one boolean
(True/False, and/or, a ``not`` dropped) or one small integer constant, in place;
the tests run against it (``-x``, no random order) and the file is restored.  A
mutant is killed when the tests fail or hang.  Run it alone: the files it
mutates are the working tree's.

    python tools/mutation_probe.py packages/dislock-core/src/dislock/core/lease_state.py \
        [-- tests/unit/test_lock_states.py ...]
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

FLIPS = {
    "<": "<=",
    "<=": "<",
    ">": ">=",
    ">=": ">",
    "==": "!=",
    "!=": "==",
    "+": "-",
    "-": "+",
    "True": "False",
    "False": "True",
    "and": "or",
    "or": "and",
    "not": "",
}


def mutants(source: str) -> Iterator[tuple[int, int, str, str]]:
    """Each mutant of ``source``: its line, column, the token and its replacement."""
    lines = iter(source.splitlines(keepends=True))
    depth = 0  # inside an f-string (Python 3.12 tokenizes its parts)
    for token in tokenize.generate_tokens(lambda: next(lines, "")):
        name = tokenize.tok_name[token.type]
        depth += (name == "FSTRING_START") - (name == "FSTRING_END")
        row, col = token.start
        if depth or token.type not in (tokenize.OP, tokenize.NAME, tokenize.NUMBER):
            continue
        if token.string in FLIPS:
            yield row, col, token.string, FLIPS[token.string]
        elif token.type == tokenize.NUMBER and token.string.isdigit() and int(token.string) < 10:
            yield row, col, token.string, str(int(token.string) + 1)


def killed(
    path: Path, source: str, row: int, col: int, old: str, new: str, tests: list[str]
) -> bool:
    lines = source.splitlines(keepends=True)
    line = lines[row - 1]
    lines[row - 1] = line[:col] + new + line[col + len(old) :]
    path.write_text("".join(lines))
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly", *tests]
    try:
        run = subprocess.run(command, capture_output=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return True
    finally:
        path.write_text(source)
    return run.returncode != 0


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # (so that the file is restored)
    modules, tests = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    for module in modules:
        path = Path(module)
        source = path.read_text()
        found = list(mutants(source))
        survivors = [m for m in found if not killed(path, source, *m, tests or ["tests/unit"])]
        for row, _, old, new in survivors:
            line = source.splitlines()[row - 1].strip()
            print(f"  survived {path.name}:{row}: {old!r} -> {new!r}  | {line}")
        dead = len(found) - len(survivors)
        print(
            f"{path.name}: {dead}/{len(found)} killed ({100 * dead / max(len(found), 1):.0f} %)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
