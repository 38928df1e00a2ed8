"""Private Redis topologies for the tests: a Redis Cluster, and a primary Sentinel fails over.

Every server is a ``redis-server`` child of the test session, on loopback,
on a free port, in a temporary directory of its own; :meth:`Topology.stop`
ends them all (and an ``atexit`` hook does, if a session ends otherwise).
Nothing is kept on disk: a node that is killed comes back empty and takes
its data from its primary, as a replica.

- :class:`Cluster`: 3 primaries and 3 replicas made by ``redis-cli --cluster
  create``, with a node timeout of 1 s, so a failover takes 1 to 3 s.
- :class:`SentinelSet`: a primary, its replica and 3 sentinels (quorum 2)
  that call the primary down after 1 s.

Both offer ``kill_primary`` (SIGKILL, then wait for the promotion) and
``heal`` (the killed node back, as a replica, in sync), and the cluster
``reshard``. Every wait polls with a deadline.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tests.redis_process import HOST, Server, Topology, data_options, until
from tests.redis_sentinels import SERVICE, AstraySentinel, sentinel_server
from tests.servers import free_port

# Redis abandons a manual failover after 5 s (CLUSTER_MF_TIMEOUT); each ask
# gets twice that to show, and there are enough asks for a busy minute.
MANUAL_FAILOVER_WAIT = 10.0
FAILOVER_ATTEMPTS = 6

NODE_TIMEOUT_MS = 1000

T = TypeVar("T")


@dataclass(frozen=True)
class ClusterNode:
    """One line of ``CLUSTER NODES``."""

    id: str
    port: int
    primary: bool
    failed: bool
    primary_id: str
    slots: list[int] = field(default_factory=list)


class Cluster(Topology):
    """A Redis Cluster of 3 primaries, each with one replica."""

    def start(self) -> Cluster:
        for i in range(6):
            bus = free_port()

            def options(port: int, workdir: Path, bus: int = bus) -> list[str]:
                return [
                    *data_options(port, workdir),
                    *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
                    *("--cluster-port", str(bus), "--cluster-node-timeout", str(NODE_TIMEOUT_MS)),
                    # A replica takes over however long it was cut off from its primary.
                    *("--cluster-replica-validity-factor", "0"),
                ]

            self._server(f"node{i}", options).start()
        nodes = [f"{HOST}:{s.port}" for s in self.servers]
        self._cli("create", *nodes, "--cluster-replicas", "1", "--cluster-yes")
        self.wait_healthy()
        return self

    @property
    def url(self) -> str:
        """Two seed nodes, as a user would name them."""
        return f"redis+cluster://{HOST}:{self.servers[0].port},{HOST}:{self.servers[1].port}/"

    def server(self, port: int) -> Server:
        return next(s for s in self.servers if s.port == port)

    def nodes(self) -> list[ClusterNode]:
        """The cluster as a live node sees it."""
        asked = next(s for s in self.servers if s.alive)
        with asked.client() as client:
            text = client.execute_command("CLUSTER", "NODES")
        text = text.decode() if isinstance(text, bytes) else str(text)
        return [_node(line) for line in text.splitlines() if line.strip()]

    def primaries(self) -> list[ClusterNode]:
        return [n for n in self.nodes() if n.primary and not n.failed]

    def wait_healthy(self) -> None:
        """Every node up and saying ``ok``, 3 primaries serving every slot, each with a
        replica in sync."""

        def healthy() -> bool:
            if not all(s.alive for s in self.servers):
                return False
            for server in self.servers:
                with server.client() as client:
                    if client.cluster("INFO")["cluster_state"] != "ok":
                        return False
            nodes = self.nodes()
            primaries = [n for n in nodes if n.primary and not n.failed]
            replicas = [n for n in nodes if not n.primary and not n.failed]
            if len(primaries) != 3 or sum(len(p.slots) for p in primaries) != 16384:
                return False
            if {r.primary_id for r in replicas} != {p.id for p in primaries}:
                return False
            return all(self.in_sync(self.server(r.port)) for r in replicas)

        until(healthy, "the cluster healthy")

    def kill_primary(self, port: int | None = None) -> Server:
        """SIGKILL a primary (the first, or the one on ``port``); return once its replica
        was promoted and every live node says the cluster is ``ok``."""
        primary = next(n for n in self.primaries() if port is None or n.port == port)
        victim = self.server(primary.port)
        victim.kill()

        def promoted() -> bool:
            serving = [n for n in self.primaries() if n.port != victim.port]
            if sum(len(n.slots) for n in serving) != 16384:
                return False
            for server in self.servers:
                if server.alive:
                    with server.client() as client:
                        if client.cluster("INFO")["cluster_state"] != "ok":
                            return False
            return True

        until(promoted, f"a replica promoted in place of {victim.port}")
        return victim

    def switch_over(self) -> None:
        """A planned failover: a replica takes its primary's slots over, the primary
        (still up) becomes its replica; return once the cluster is healthy again."""
        primary = self.primaries()[0]
        replica = next(n for n in self.nodes() if n.primary_id == primary.id)

        def promoted() -> bool:
            return bool(self.server(replica.port).info("replication")["role"] == "master")

        # A manual failover that does not finish within Redis's own 5 s (the
        # primary slow to pause its clients, or the replica to catch up, on a
        # busy machine) is abandoned without a word, and never retried: ask
        # again, as an operator would, until the overall deadline.
        for attempt in range(1, FAILOVER_ATTEMPTS + 1):
            with self.server(replica.port).client() as client:
                client.cluster("FAILOVER")
            try:
                until(promoted, "the replica promoted", MANUAL_FAILOVER_WAIT)
                break
            except TimeoutError:
                if attempt == FAILOVER_ATTEMPTS:
                    raise
        self.wait_healthy()

    def heal(self, victim: Server) -> None:
        """Start a killed node again: it rejoins as the replica of its successor,
        and may be failed over to only once it holds its successor's data."""
        # It comes back empty and waits for its full sync (the primary's diskless
        # delay: 5 s). A primary stalled past the node timeout meanwhile would
        # otherwise be failed over to this empty node, and every write lost.
        victim.start("--cluster-replica-no-failover", "yes")
        self.wait_healthy()
        with victim.client() as client:
            client.config_set("cluster-replica-no-failover", "no")

    def reshard(self, source: str, target: str, slots: int) -> None:
        """Move ``slots`` slots, and the keys in them, from node ``source`` to ``target``."""
        # redis-cli refuses to reshard a cluster its own check finds fault with
        # (views that differ between nodes, a slot left open, a node flagged as
        # failing): wait for that check to pass, so a refusal below means the
        # cluster went wrong during the reshard.
        entry = f"{HOST}:{self.servers[0].port}"
        until(lambda: self._cli("check", entry, fail=False), "every node agreeing on the cluster")
        self._cli(
            *("reshard", entry, "--cluster-from", source, "--cluster-to", target),
            *("--cluster-slots", str(slots), "--cluster-yes"),
        )

    @staticmethod
    def _cli(*args: str, fail: bool = True) -> bool:
        """``redis-cli --cluster`` with ``args``: whether it succeeded, or (``fail``)
        an error quoting what it said."""
        done = subprocess.run(
            ["redis-cli", "--cluster", *args], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0 and fail:  # it says why on stdout, among its progress lines
            said = [line for line in done.stdout.splitlines() if not line.startswith("Moving slot")]
            raise AssertionError(f"redis-cli --cluster {args[0]}: {said[-15:]} {done.stderr}")
        return done.returncode == 0


def _node(line: str) -> ClusterNode:
    # id, address, flags, primary, ping sent, pong received, epoch, link state, slots...
    node_id, address, flags, primary_id, *_, ranges = *line.split()[:8], line.split()[8:]
    port = int(address.split("@")[0].rsplit(":", 1)[1])
    slots: list[int] = []
    for part in ranges:
        if part.startswith("["):  # a slot being migrated or imported: its owner is listed too
            continue
        start, _, end = part.partition("-")
        slots.extend(range(int(start), int(end or start) + 1))
    flagged = set(flags.split(","))
    return ClusterNode(
        node_id, port, "master" in flagged, bool(flagged & {"fail", "fail?"}), primary_id, slots
    )


class SentinelSet(Topology):
    """A primary, one replica, and 3 sentinels watching them under :data:`SERVICE`."""

    def start(self) -> SentinelSet:
        primary = self._server("data0", data_options).start()
        replica_of = ["--replicaof", HOST, str(primary.port)]
        self._server("data1", lambda p, w: [*data_options(p, w), *replica_of]).start()
        until(lambda: self.in_sync(self.servers[1]), "the replica in sync")
        self.sentinels = [self._sentinel(i, primary.port) for i in range(3)]
        self.wait_watched()
        return self

    def _sentinel(self, i: int, primary_port: int) -> Server:
        server = sentinel_server(self.root, f"sentinel{i}", primary_port)
        self.servers.append(server)
        return server.start()

    @property
    def url(self) -> str:
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    @property
    def data(self) -> list[Server]:
        return [s for s in self.servers if s not in self.sentinels]

    def primary_port(self) -> int:
        """Where every sentinel says the primary is (they agree, or this waits)."""

        def agreed() -> int | None:
            said = set()
            for sentinel in self.sentinels:
                with sentinel.client() as client:
                    _, port = client.sentinel_get_master_addr_by_name(SERVICE)
                    said.add(int(port))
            return said.pop() if len(said) == 1 else None

        return until(agreed, "the sentinels agreeing on the primary")

    def primary(self) -> Server:
        port = self.primary_port()
        return next(s for s in self.data if s.port == port)

    def wait_watched(self) -> None:
        """Every sentinel knows the two others and sees the replica up (so it could
        promote it), and the replica is in sync."""

        def watched() -> bool:
            for sentinel in self.sentinels:
                with sentinel.client() as client:
                    state = client.sentinel_master(SERVICE)
                    if state["num-other-sentinels"] != 2:
                        return False
                    replicas = client.sentinel_slaves(SERVICE)
                    if not replicas or any(r["is_sdown"] for r in replicas):
                        return False
            primary = self.primary_port()
            replicas = [s for s in self.data if s.port != primary]
            return all(s.alive and self.in_sync(s) for s in replicas)

        until(watched, "the sentinels watching primary and replica")

    def kill_primary(self) -> Server:
        """SIGKILL the primary; return once the sentinels promoted the replica."""
        victim = self.primary()
        victim.kill()

        def promoted() -> bool:
            port = self.primary_port()
            if port == victim.port:
                return False
            info = next(s for s in self.data if s.port == port).info("replication")
            return info.get("role") == "master"

        until(promoted, f"the replica promoted in place of {victim.port}")
        return victim

    def switch_over(self) -> None:
        """A planned failover (``SENTINEL FAILOVER``): the replica is promoted, the primary
        (still up) becomes its replica; return once the sentinels agree on it."""
        before = self.primary_port()
        with self.sentinels[0].client() as client:
            client.sentinel_failover(SERVICE)
        until(lambda: self.primary_port() != before, "the replica promoted")
        self.wait_watched()

    def heal(self, victim: Server) -> None:
        """Start a killed primary again, as the replica of its successor; the
        sentinels may promote it only once it holds its successor's data."""
        successor = self.primary_port()
        victim.options = [*data_options(victim.port, victim.workdir)]
        victim.options += ["--replicaof", HOST, str(successor)]
        # It comes back empty and waits for its full sync (the primary's diskless
        # delay: 5 s). Sentinels promote a replica whose link is down for less
        # than ten down-after periods: a primary stalled past one meanwhile was
        # failed over to this empty node, and every acknowledged write lost.
        victim.start("--replica-priority", "0")
        until(lambda: self.in_sync(victim), "the restarted node in sync")
        with victim.client() as client:
            client.config_set("replica-priority", 100)
        self.wait_watched()
        until(lambda: self._promotable(victim.port), "the sentinels seeing it promotable")

    def _promotable(self, port: int) -> bool:
        for sentinel in self.sentinels:
            with sentinel.client() as client:
                replicas = client.sentinel_slaves(SERVICE)
            if not any(r["port"] == port and r["slave-priority"] > 0 for r in replicas):
                return False
        return True


@contextlib.contextmanager
def running(topology: T) -> Iterator[T]:
    """``topology`` started, and stopped whatever happens."""
    assert isinstance(topology, Cluster | SentinelSet | AstraySentinel)
    try:
        topology.start()
        yield topology
    finally:
        topology.stop()
