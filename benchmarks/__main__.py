"""``hatch run bench`` (``python -m benchmarks``): the options, and which measures run at what size.

--quick            one pass of everything, small sizes (CI's smoke test)
--no-write         print the table, leave docs/benchmarks.md and .png alone
--only a,b         only these measures (printed, nothing written)
--against REV      the start-up rows also run revision REV's wrapper, interleaved
--herd N           only the herd, N machines against a role capped at --herd-cap,
                   straight to the server and through PgBouncer (printed)
"""

from __future__ import annotations

import argparse
import compileall
from collections.abc import Callable
from functools import partial
from pathlib import Path

import benchmarks
from benchmarks.cli import cli_rows
from benchmarks.cycle import cycle_rows
from benchmarks.fence import fence_rows
from benchmarks.herd import HERD_SIZES, herd_rows
from benchmarks.history import HISTORY_ROWS, history_rows
from benchmarks.hot import hot_rows
from benchmarks.import_cost import import_rows
from benchmarks.output import output_rows
from benchmarks.plot import plot
from benchmarks.race import race_rows
from benchmarks.renewal_cpu import renewal_cpu_rows
from benchmarks.report import page, render
from benchmarks.roles import roles_rows
from benchmarks.rows import Row
from benchmarks.scale import lease_scale_rows
from benchmarks.serve import SERVE_SIZES, serve_rows
from benchmarks.server import bench_database
from benchmarks.waiting import waiting_rows

ROOT = Path(__file__).resolve().parent.parent


def measures(
    url: str, quick: bool, against: str | None = None
) -> list[tuple[str, Callable[[], list[Row]]]]:
    """Every measure by the name ``--only`` takes, in the table's order, at its size."""
    repeat = 1 if quick else 9
    return [
        ("cli", partial(cli_rows, url, 1 if quick else 21, against)),
        ("import", partial(import_rows, 3 if quick else 15)),
        ("cycle", partial(cycle_rows, url, 10 if quick else 150)),
        ("roles", partial(roles_rows, url, repeat, 10 if quick else 150)),
        ("fence", partial(fence_rows, url, 50 if quick else 1000, 3 if quick else 15)),
        ("race", partial(race_rows, url, 32)),
        ("waiting", partial(waiting_rows, url, 5 if quick else 40)),
        ("herd", partial(herd_rows, url, HERD_SIZES[quick])),
        ("scale", partial(lease_scale_rows, url, 50 if quick else 1000)),
        ("renewal", partial(renewal_cpu_rows, url, 2.0 if quick else 10.0)),
        ("output", partial(output_rows, url, 16 if quick else 256)),
        ("hot", partial(hot_rows, url, 50 if quick else 1000, 4.0 if quick else 300.0)),
        (
            "history",
            partial(history_rows, url, 10 if quick else 200, 10_000 if quick else HISTORY_ROWS),
        ),
        ("serve", partial(serve_rows, url, *SERVE_SIZES[quick])),
    ]


def main() -> int:
    doc = benchmarks.__doc__ or ""
    parser = argparse.ArgumentParser(prog="hatch run bench", description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--only",
        help="comma-separated parts to run (cli, import, cycle, roles, fence, race, waiting,"
        " herd, scale, renewal, output, hot, history, serve); prints their rows and writes nothing",
    )
    parser.add_argument(
        "--herd",
        type=int,
        metavar="N",
        help="only the herd, N machines against a role capped at --herd-cap (printed)",
    )
    parser.add_argument("--herd-cap", type=int, default=50, metavar="C")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="also run the wrapper of git revision REV (built from its wheels) beside ours",
    )
    args = parser.parse_args()
    parts = set(args.only.split(",")) if args.only else None
    # What pip does on install, so that our modules are not compiled on every
    # run when the environment disables writing bytecode (editable installs).
    compileall.compile_dir(ROOT / "packages", quiet=1)
    with bench_database() as url:
        if args.herd:
            print(render(herd_rows(url, [(args.herd, args.herd_cap)]), args.quick))
            return 0
        rows = []
        for name, measure in measures(url, args.quick, args.against):
            if parts is None or name in parts:
                rows += measure()
    table = render(rows, args.quick)
    print(table)
    if not args.no_write and parts is None:
        (ROOT / "docs" / "benchmarks.md").write_text(page(table))
        plot(rows, ROOT / "docs" / "benchmarks.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
