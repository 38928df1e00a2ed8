"""What a Redis server's set-up risks for semel's keys, read from the server itself.

``semel migrate`` and the worker's start-up say it: no persistence, an
evicting memory policy, fewer replicas than the writes wait for. Under
Cluster every primary is asked; under Sentinel, the current primary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from semel.stores.redis.errors import passes
from semel.stores.redis.eval import pack
from semel.stores.redis.lender import Source
from semel.stores.redis.wire import send

NO_PERSISTENCE = "Redis keeps nothing on disk: a restart forgets every key"
EVICTING = (
    "maxmemory-policy {policy} lets Redis evict semel's keys when memory runs short: "
    "a late copy of an evicted completed key runs its handler again, and a copy of an "
    "evicted claim runs beside its owner (whose writes are then refused); set "
    "maxmemory-policy noeviction (a full Redis then pauses consumption instead)"
)
FEW_REPLICAS = (
    "every write waits for {wanted} replica acknowledgements but the primary has "
    "{replicas} replicas connected: writes count as failed, and consumption pauses, "
    "until enough are"
)

# CONFIG GETs one at a time: several names in one call needs Redis 7.
_FACTS = [
    pack(b"CONFIG", b"GET", b"appendonly"),
    pack(b"CONFIG", b"GET", b"save"),
    pack(b"CONFIG", b"GET", b"maxmemory-policy"),
    pack(b"INFO", b"replication"),
    pack(b"INFO", b"cluster"),
]


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What one server says of itself; ``None`` where the server would not tell."""

    config: dict[str, str] | None
    replicas: int | None
    cluster_enabled: bool


async def server_facts(pool: Source) -> ServerFacts:
    """The facts of the server ``pool`` reaches, in one round trip."""
    replies = await send(pool, _FACTS)
    for reply in replies:
        if isinstance(reply, ResponseError) and passes(reply):
            raise reply
    *configs, replication, cluster = replies
    config: dict[str, str] | None = {}
    for reply in configs:
        if isinstance(reply, ResponseError):
            config = None  # CONFIG disabled, renamed or not granted: managed Redis often does
        elif config is not None:
            # A map under RESP3, a flat [name, value] list under RESP2.
            pairs = reply if isinstance(reply, dict) else dict([reply[:2]] if reply else [])
            config |= {bytes(k).decode(): bytes(v).decode() for k, v in pairs.items()}
    info = _info(replication) | _info(cluster)
    replicas = int(info["connected_slaves"]) if "connected_slaves" in info else None
    return ServerFacts(config, replicas, info.get("cluster_enabled") == "1")


def _info(reply: Any) -> dict[str, str]:
    if isinstance(reply, ResponseError):
        return {}  # INFO not granted: nothing known, nothing said
    lines = bytes(reply).decode().splitlines()
    return dict(line.split(":", 1) for line in lines if ":" in line and not line.startswith("#"))


def warnings_of(facts: ServerFacts, replicas_ack: int) -> list[str]:
    """What the operator should know of one server's set-up."""
    said = []
    config = facts.config
    if config is not None:
        if config.get("appendonly") == "no" and not config.get("save"):
            said.append(NO_PERSISTENCE)
        policy = config.get("maxmemory-policy", "noeviction")
        if policy != "noeviction":
            said.append(EVICTING.format(policy=policy))
    if facts.replicas is not None and facts.replicas < replicas_ack:
        said.append(FEW_REPLICAS.format(wanted=replicas_ack, replicas=facts.replicas))
    return said


def merged(by_node: Sequence[tuple[str, list[str]]]) -> list[str]:
    """Warnings of several primaries, each said once with the primaries it concerns."""
    nodes: dict[str, list[str]] = {}
    for node, said in by_node:
        for warning in said:
            nodes.setdefault(warning, []).append(node)
    return [f"{warning} (primaries {', '.join(names)})" for warning, names in nodes.items()]
