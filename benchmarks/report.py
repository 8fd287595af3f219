"""The benchmark page: the markdown table of the rows, and docs/benchmarks.md around it.

Every cell is read from a ``Row``: its measure, its result (formatted from the
numbers it measured), its target and verdict.  ``READING`` explains how to read
the results; it is written after the table and the plot.
"""

from __future__ import annotations

import time

from benchmarks.rows import Row

READING = """## Reading the results

- **Waiting.** The hand-over is timed from just before the holder's release to the moment the
  waiting wrapper's command (`date +%s.%N`) runs: the release's `NOTIFY`, the waiter's wake-up
  and upsert, and starting the command. With polling it is dominated by the time to the next
  poll, on average a little over half the 0.5 s poll interval (the jitter spreads polls over
  0.25 to 0.75 s). The 20 waiters and the 50 slot contenders are threads of one process, started
  together; the time until all are done, against the work they did, is the hand-over overhead.
- **The CLI against the floor.** The floor starts Python, imports psycopg, connects, runs
  `SELECT 1` and exits; the wrapper does that too, then takes the lock (one call of the lock
  function `init` installed), *starts the command*, waits for it and releases (one call). Both,
  dislock 0.1.0 and, with `--against REV`, an older revision of this repository are installed
  from wheels into fresh venvs, as `pipx` installs them (an editable install adds a `sys.path`
  entry per member that every import searches), and run in turns, each round in the other
  order. The floor against 0.1.0 is the least ours against 0.1.0 can be, unless ours beats the
  floor; it is printed beside that ratio. Ours can beat it a little: the command and its guard
  (a process outside the command's process group that kills the whole group if the wrapper dies
  or lets the lease's deadline pass) are started with `vfork`; once the locks are released and
  the connection closed, the process ends without the interpreter's teardown
  (`dislock.cli.exit_now`), which costs any process that imported psycopg about 18 ms;
  and dislock's processes import psycopg without `importlib.metadata`
  (`dislock.cli.quick_psycopg`: 12 to 17 ms of every run here). The floor and 0.1.0 pay both.
  dislock's own imports add about 2 ms beyond psycopg; a schedule run also imports croniter
  (6 to 8 ms with `dateutil` and `platform`, and its import runs `file` on the interpreter, a
  subprocess of 2 to 3 ms, through `platform.architecture()`), as 0.1.0 does on every run, and
  sends one call where a lease sends two: that import is the gap between the schedule row and
  the lease row. Counted in instructions (callgrind, which load does not move), a lone lease
  run is 666 M, a schedule run 713 M, of which croniter's import is 37 M.
- **The herd.** Every machine's crontab fires in the same second; here 200 to 2,000 asyncio
  event loops in one process (each its own connection, as separate hosts would have) race one
  lock through a role whose `CONNECTION LIMIT` is 20 or 50. Refused connections are retried with
  jittered exponential backoff (`connect_patience_seconds`), so no machine fails; with the
  patience set to 0, most of them fail with `too many connections for role`. A machine that
  was refused a connection first reads the key's row before it calls the lock function, so a
  loser that waited at the door costs the server a connection and a primary-key read. The floor
  beside each direct herd is as many machines that only connect (refusals retried with
  dislock's own backoff) and read one row by its key. Every machine is a new server session:
  the server compiles the lock function and plans its statements once per session, so a herd
  gains nothing from the plans a warm connection keeps. Measured on fresh sessions one after
  another (server CPU: the postmaster and the backends it reaped): a bare connection about
  2.5 ms, one that reads a row by its key 2.7 ms, one whose acquisition is refused 4.8 ms (the
  owner's role; 6.9 ms before the lock functions asked the owner's case first, and the same
  acquisition as the plain statement, on a table without the functions, about 6 ms). Through
  PgBouncer the server sees 20 connections, whatever the fleet's size, and keeps their plans:
  each machine costs one call.
- **Warm cycles.** Taking and releasing a lock are two writes, and PostgreSQL commits a write
  only once its WAL is on disk, so two `SELECT 1` are not a floor any lock can reach; two
  single-row `UPDATE`s are. Sending the very same two calls by hand with psycopg shows what
  dislock adds on top of the calls themselves. On a table with the lock functions, each step is
  one call: the server plans the statements inside once per session and keeps the plans (behind
  PgBouncer too, where nothing is prepared); the acquisition reads every row it decides by (the
  failover timeline, the maximum TTL, the role's TTL record, the pause, the key's row) in one
  primary-key read, and refuses a live row before its upsert would lock it. On a table without
  them (made by hand, or by 0.1.0) dislock sends the plain statements, as before: a shared
  connection that has served eight statements checks once whether it reaches the server
  directly and only then lets psycopg prepare them.
- **`dislockctl serve`.** A scrape reads each key's latest run and latest success through the
  history's `(lock_key, started_at)` index (a few probes per key, whatever the history's
  length), and of the rest only the runs that are new since the previous scrape: run counts and
  the missed-slot window are kept in the server, so only its first scrape reads the whole
  history (and enumerates each schedule's slots of the last 24 hours). `prometheus_client`
  renders the exposition in chunks of 100 samples, each again only when its samples changed.
- **Run history.** A run with `LOCK_HISTORY=1` sends two more statements (an `INSERT` as it
  starts, an `UPDATE` as it ends), each committing asynchronously (`synchronous_commit` off for
  its own transaction), so it pays two round trips and no WAL flush. The CLI comparison times
  whole processes: differences of a few milliseconds either way are noise there. `history` and
  `missed` read the `(lock_key, started_at DESC)` index (`history` without a key the
  `(started_at)` one, backwards): `Index Scan using key_value_history_key_started … Index Cond:
  ((lock_key = 'job-7') AND (started_at >= (now() - '24:00:00')))`, then `Limit`; the lock table is
  read only for runs without an end (running or abandoned?).
- **Pause check.** The acquiring statement reads the key's pause row in a CTE (a primary-key
  lookup) and answers in the same round trip; the row compares it with the same upsert without
  the check, sent by hand.
- **Fencing enforced by the database.** Two tables alike but for `dislockctl fence`'s guard get
  the same transactions in turns, each carrying the token (`set_config(..., true)`), so the
  ratio is the guard's: its check, run at commit for each changed row, reads the key's lease
  row (no row lock). A one-row write pays that check and little else; a `COPY` pays it for
  each of its 10,000 rows. (The guard once queued only a transaction's first check, marked in
  a session setting that a writer could set itself to skip the check, #61: the figures
  above predate the change.)
- **Scale.** Every lease of a process is renewed by one `UPDATE … FROM unnest(…)` per tick, over
  one connection; the renewal statement's latency is what a thousand leases cost per second.
"""


def render(rows: list[Row], quick: bool) -> str:
    lines = [
        "| measure | result | target | verdict |",
        "|---|---|---|---|",
        *(f"| {r.measure} | {r.result} | {r.target} | {r.verdict} |" for r in rows),
    ]
    mode = "quick mode (one pass, small sizes)" if quick else "full mode"
    return f"Measured {time.strftime('%Y-%m-%d')}, {mode}.\n\n" + "\n".join(lines)


def page(table: str) -> str:
    """docs/benchmarks.md: the table, the plot and how to read them."""
    return (
        "# Benchmarks\n\nGenerated by `hatch run bench` (see `benchmarks/`): medians,"
        " and ratios measured side by side in one run on the same machine.\n\n"
        + table
        + "\n\n![CLI wall time relative to the floor](benchmarks.png)\n\n"
        + READING
    )
