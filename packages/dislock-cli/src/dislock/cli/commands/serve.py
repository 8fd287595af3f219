"""``dislockctl serve``: Prometheus metrics (``/metrics``) and a status page (``/``)
over HTTP, read-only (the server itself is ``dislock.cli.serve.server``)."""

from __future__ import annotations

import argparse

from dislock.cli.commands._call import Call, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default="127.0.0.1:9655",
        help="address to listen on (default: 127.0.0.1:9655, this machine only)",
    )
    parser.add_argument(
        "--allow-host",
        metavar="NAME",
        action="append",
        default=[],
        help="also answer requests for this Host name (repeatable; loopback names and "
        "--listen's host are always answered, any other gets 421)",
    )
    parser.add_argument(
        "--max-connections",
        metavar="N",
        type=positive_int,
        default=32,
        help="connections served at once; more are refused with 503 (default 32)",
    )
    parser.add_argument(
        "--max-connections-per-client",
        metavar="N",
        type=positive_int,
        default=8,
        help="connections served at once from one client address (an IPv6 one's /64); "
        "more from it are refused with 503 (default 8)",
    )
    parser.add_argument(
        "--max-idle-connections",
        metavar="N",
        type=positive_int,
        default=16,
        help="connections kept at once, from all clients, that have not sent their whole "
        "request; one more closes the oldest of them (default 16)",
    )
    parser.add_argument(
        "--request-timeout",
        metavar="SECONDS",
        default="5",
        help="a client that has not sent its whole request by then, or not read the "
        "answer within as long again, is dropped (default 5)",
    )


def run(call: Call) -> int:
    from dislock.cli.serve.http_policy import Limits, request_timeout
    from dislock.cli.serve.server import serve

    args = call.args
    history = call.history_table()
    limits = Limits(
        args.max_connections,
        request_timeout(args.request_timeout),
        args.max_connections_per_client,
        args.max_idle_connections,
    )
    return serve(call.url, call.table, history, args.listen, args.allow_host, limits)
