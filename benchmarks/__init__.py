"""dislock's benchmarks: medians, and ratios measured side by side in the same run.

    hatch run bench            # every measure, several runs each (a few minutes)
    hatch run bench --quick    # one pass of everything, small sizes (CI's smoke test)

It starts its own embedded PostgreSQL (or uses ``BENCH_DATABASE_URL``), and
installs ``dislock==0.1.0`` from PyPI into a throwaway venv as the baseline a
user would otherwise pick (measured as a black box through its command line).
Machines here are noisy: absolute times are context, the ratios are the result.
Nothing here asserts a time.  The table and a plot go to ``docs/benchmarks.md``
and ``docs/benchmarks.png`` unless ``--no-write``.

Layout: ``__main__`` parses the options and runs the measures; one module per
measure (``cli``, ``import_cost``, ``cycle``, ``roles``, ``fence``, ``race``,
``waiting``, ``herd``, ``scale``, ``hot``, ``history``, ``serve``) returns its
``rows.Row``\\ s; ``timing``, ``wrapper``, ``installs`` and ``server`` are what
several measures share (``herd_pgbouncer`` is the herd's PgBouncer); ``report`` and
``plot`` turn the rows' numbers into the page and its figure.
"""
