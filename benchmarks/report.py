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
  `SELECT 1` and exits; the wrapper does that too, then takes the lock, *starts the command*,
  waits for it and releases. Both, and dislock 0.1.0, are installed from wheels into fresh
  venvs, as `pipx` installs them (an editable install adds a `sys.path` entry per member that
  every import searches). Three things make the wrapper cheaper than it looks: a schedule slot
  is picked by the database clock inside the acquiring statement (no round trip to read the
  clock); the command and its guard (a process outside the command's process group that kills
  the whole group if the wrapper dies or lets the lease's deadline pass) are started with
  `vfork`, since neither runs Python in the forked child; and once the locks are released and
  the connection closed, the process ends without the interpreter's teardown
  (`dislock.cli.process_exit`), which costs any process that imported psycopg about 18 ms: the floor
  and 0.1.0 pay it, so the wrapper can beat the floor. And dislock's processes import psycopg
  without `importlib.metadata` (`dislock.cli.quick_psycopg`): psycopg imports it, with `email`,
  `zipfile` and `csv`, only so that its two `version` modules can look their distributions'
  versions up, 12 to 17 ms of every run here; dislock reads them from the `.dist-info` folders'
  names instead. The floor and 0.1.0 pay it. dislock's own imports add about 2 ms beyond
  psycopg (a lone run imports what only a wait, a replacement or a refusal needs when one
  comes); a schedule run also imports croniter (about 6 ms), as 0.1.0 does on every run.
- **The herd.** Every machine's crontab fires in the same second; here 200 to 2,000 asyncio
  event loops in one process (each its own connection, as separate hosts would have) race one
  lock through a role whose `CONNECTION LIMIT` is 20 or 50. Refused connections are retried with
  jittered exponential backoff (`connect_patience_seconds`), so no machine fails; with the
  patience set to 0, most of them fail with `too many connections for role`. A machine that
  was refused a connection first reads the key's row before it sends the acquiring statement,
  so a loser that waited at the door costs the server a connection and a primary-key read (a
  lone run, which finds the door open, sends the acquiring statement alone: one round trip,
  and the first machines in pay for planning it). That is still several milliseconds
  each: a backend is forked, authenticated and loads its catalog caches for every connection
  (a bare connect and close costs about 2 ms here, a refused one about 1.5 ms), and the
  server shares the machine's two cores with the herd's process. Through PgBouncer the server
  sees 20 connections, whatever the fleet's size, and each machine costs one statement; the
  decision times there are those of the herd's one Python process, which holds 2,000
  connections and their event loops. The floor beside each direct herd is as many machines
  that only connect (refusals retried with dislock's own backoff) and read one row by its key.
  What stands between the herd and it, counted on a 1,000-machine herd capped at 50: the
  machines come through the door over seconds, not at once, so most find it open (a lease herd:
  977 of 1,000 sent the acquiring statement, 23 were refused first and looked); and the
  acquiring statement, planned by a backend whose catalog caches are cold, costs it about
  5.5 ms of CPU against 2 ms for a bare connection and 3 ms for one that reads a row (medians of
  a fresh connection each, 60 rounds). Its reads of one table folded into one scan plan 25 %
  faster warm but no faster cold (measured: the cold cost is the number of distinct functions,
  operators and casts its CTEs name, a few tenths of a millisecond each).
- **Warm cycles.** Taking and releasing a lock are two writes, and PostgreSQL commits a write
  only once its WAL is on disk, so two `SELECT 1` are not a floor any lock can reach; two
  single-row `UPDATE`s are. Sending the very same two statements by hand with psycopg (prepared
  as dislock prepares them) shows what dislock adds on top of the statements themselves. The
  acquiring statement is heavier than an `UPDATE`: it reads the key's pause row and the
  failover lock-delay rows in the same round trip. Unprepared, PostgreSQL parses and plans it
  anew on every execution (`EXPLAIN ANALYZE`: 0.17 ms of planning for 0.07 ms of execution,
  and parsing it costs about as much again): sent by hand, its round trip took 0.68 ms, against
  0.22 ms prepared. So a shared connection that has served eight statements (more than a
  one-shot wrapper run sends) checks once whether it reaches the server directly (a pooler
  answers the startup with a backend process id of its own making, unlike `pg_backend_pid()`)
  and only then lets psycopg prepare the statements it repeats; after PostgreSQL's first five
  custom plans the upsert runs a cached generic plan. What is left against the `UPDATE`s is the
  prepared upsert's own work (its lock-delay and pause reads, two conditional inserts that
  write nothing), the connection's first dozen cycles, which each round of the measure pays
  again on a new connection, and dislock's own bookkeeping. Behind PgBouncer nothing is
  prepared, and a warm cycle still pays the parsing and planning (about 0.45 ms of the
  acquisition).
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
  ratio is the guard's: its check, run once per transaction at commit, reads the key's lease
  row `FOR SHARE`. A one-row write pays that check and little else. A `COPY` pays it once too,
  but the trigger's `WHEN` (the function that queues only the transaction's first check) is
  still evaluated for every row, 10,000 times here: that expression, not the check, is what
  the `COPY`'s ratio measures (with `WHEN (false)` instead, the `COPY` takes the unguarded
  time). The function is written to be inlined into the `WHEN` (no `SET search_path`, every
  name qualified instead): pinned, it cost the `COPY` 3.2 x; inlined, about 1.6 x.
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
