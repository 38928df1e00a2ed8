"""Sentinels for the tests: the set's (:class:`tests.redis_servers.SentinelSet`), and one
astray, that calls its primary down."""

from __future__ import annotations

from pathlib import Path

from tests.redis_process import HOST, Server, Topology, until
from tests.servers import free_port

SERVICE = "semel-test"  # the primary's name under Sentinel


def sentinel_server(root: Path, name: str, primary_port: int) -> Server:
    """A sentinel (not started) watching :data:`SERVICE`'s primary on ``primary_port``."""
    port = free_port()
    workdir = root / f"{name}-{port}"
    workdir.mkdir(parents=True)
    config = workdir / "sentinel.conf"  # sentinels rewrite their configuration
    config.write_text(
        f"port {port}\nbind {HOST}\ndir {workdir}\nlogfile sentinel.log\n"
        f"sentinel monitor {SERVICE} {HOST} {primary_port} 2\n"
        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
        f"sentinel failover-timeout {SERVICE} 3000\n"
        f"sentinel parallel-syncs {SERVICE} 1\n"
    )
    return Server(port, workdir, [str(config), "--sentinel"])


class AstraySentinel(Topology):
    """One sentinel watching a primary that is not there: it says :data:`SERVICE`'s primary
    is down, as the first sentinel to see a primary die does while the others still
    name it."""

    def start(self) -> AstraySentinel:
        nobody = free_port()  # nothing listens there
        self.sentinel = sentinel_server(self.root, "astray", nobody)
        self.servers.append(self.sentinel)
        self.sentinel.start()

        def says_down() -> bool:
            with self.sentinel.client() as client:
                return bool(client.sentinel_master(SERVICE)["is_sdown"])

        until(says_down, "the astray sentinel calling the primary down")
        return self

    def clients(self) -> int:
        """Connections the sentinel has open, this question's own left out."""
        with self.sentinel.client() as client:
            return len(client.client_list()) - 1
