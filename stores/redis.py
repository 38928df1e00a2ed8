"""The Redis store: one hash per key, every decision taken inside a Lua script.

A record is a single hash at ``<prefix>:<key>``: one key is one hash slot,
so it needs no ``{...}`` hash tag and the scripts, which touch only KEYS[1],
would run unchanged under a Redis Cluster client. Each operation is one
EVALSHA of a script in ``stores/redis_scripts/``: the claim inspects, takes
over or refuses and returns the record in the same round trip. Leases are
server-clock milliseconds (``TIME``); retention is the key's own expiry,
refreshed by every write, so Redis forgets finished keys by itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from settings import Settings, redact
from stores.base import JSON, POISON_ERROR, Claim, Outcome, Record, Status, Store, StoreConfig
from stores.codec import dump_result, from_epoch_ms, load_result, store_config
from stores.errors import StoreUnavailable

CONNECT_TIMEOUT = 2.0
"""Seconds to open a connection: a stopped server shows up this fast."""
COMMAND_TIMEOUT = 3.0
"""Seconds to wait for a reply; a script never runs near this long."""
POOL_WAIT = 5.0
"""Seconds an operation waits for a free pooled connection; then the store counts as down."""

NO_PERSISTENCE = "Redis keeps nothing on disk: a restart forgets every key"

# Besides lost connections: a replica refuses writes until clients follow a
# failover, and a peer that does not speak RESP (a proxy, a TLS port reached
# in clear) is no store either. Both pass once fixed, so deliveries wait.
_UNREACHABLE = (
    RedisConnectionError,
    RedisTimeoutError,
    ReadOnlyError,
    InvalidResponse,
    OSError,
)

_SCRIPTS = Path(__file__).with_name("redis_scripts")

T = TypeVar("T")


def _lua(name: str) -> str:
    return (_SCRIPTS / f"{name}.lua").read_text(encoding="utf-8")


CLAIM_LUA = _lua("claim")
COMPLETE_LUA = _lua("complete")
RELEASE_LUA = _lua("release")
FAIL_LUA = _lua("fail")
HEARTBEAT_LUA = _lua("heartbeat")
GET_LUA = _lua("get")
RESET_LUA = _lua("reset")


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


def _record(key: str, reply: Sequence[Any]) -> Record:
    """Build a record from a script's reply (see claim.lua for its shape)."""
    _, now, pttl, fingerprint, status, fence, claims, lease, result, error, first, updated = reply
    return Record(
        key=key,
        fingerprint=fingerprint.decode(),
        status=Status(status.decode()),
        fence=int(fence),
        claims=int(claims),
        lease_expires_at=from_epoch_ms(None if lease is None else int(lease)),
        result=load_result(result),
        error=_text(error),
        first_seen=from_epoch_ms(None if first is None else int(first)),
        updated_at=from_epoch_ms(None if updated is None else int(updated)),
        # PTTL is -1 when someone removed the expiry by hand: nothing will forget it.
        expires_at=from_epoch_ms(now + pttl) if pttl >= 0 else None,
    )


class RedisStore(Store):
    """The store contract on Redis 5 or later.

    From 5 on, scripts replicate by their effects, so a script may read
    ``TIME`` and then write.
    """

    backend = "redis"

    def __init__(self, config: StoreConfig, client: Redis) -> None:
        super().__init__(config)
        self._client = client
        self._retention_ms = _ms(config.retention)
        self._lock_ms = _ms(config.lock_ttl)
        # A live lease must never outlast its record, or a fresh claim could
        # reuse the fence its still-running owner holds.
        self._live_ms = max(self._retention_ms, self._lock_ms)
        self._claim = client.register_script(CLAIM_LUA)
        self._complete = client.register_script(COMPLETE_LUA)
        self._release = client.register_script(RELEASE_LUA)
        self._fail = client.register_script(FAIL_LUA)
        self._heartbeat = client.register_script(HEARTBEAT_LUA)
        self._get = client.register_script(GET_LUA)
        self._reset = client.register_script(RESET_LUA)

    async def _call(self, operation: Callable[[], Awaitable[T]]) -> T:
        try:
            return await operation()
        except _UNREACHABLE as exc:
            detail = redact(f"{type(exc).__name__}: {exc}")
            raise StoreUnavailable(self.backend, detail) from exc

    async def _run(self, script: AsyncScript, key: str, *args: str | int | bytes) -> Any:
        namespaced = self.config.namespaced(key)
        return await self._call(lambda: script(keys=[namespaced], args=args))

    async def claim(self, key: str, fingerprint: str) -> Claim:
        reply = await self._run(
            self._claim,
            key,
            fingerprint,
            self._lock_ms,
            self._retention_ms,
            self._live_ms,
            self.config.max_claims,
            POISON_ERROR,
        )
        return Claim(Outcome(reply[0].decode()), _record(key, reply))

    async def complete(self, key: str, fence: int, result: JSON) -> bool:
        # No size limit: a Redis string holds 512 MB, beyond any sane result.
        data = dump_result(result)
        return bool(await self._run(self._complete, key, fence, self._retention_ms, data))

    async def release(self, key: str, fence: int) -> bool:
        return bool(await self._run(self._release, key, fence, self._retention_ms))

    async def fail(self, key: str, fence: int, error: str) -> bool:
        return bool(await self._run(self._fail, key, fence, self._retention_ms, error))

    async def heartbeat(self, key: str, fence: int) -> bool:
        return bool(await self._run(self._heartbeat, key, fence, self._lock_ms, self._live_ms))

    async def get(self, key: str) -> Record | None:
        reply = await self._run(self._get, key)
        return None if reply is None else _record(key, reply)

    async def reset(self, key: str) -> bool:
        return bool(await self._run(self._reset, key, self._retention_ms))

    async def migrate(self) -> list[str]:
        """Nothing to create; check the server answers and warn if it keeps nothing."""
        await self.ping()
        try:
            appendonly, save = await self._call(self._persistence)
        except ResponseError:
            return []  # managed Redis often disables CONFIG; no way to tell, no warning
        if appendonly.get("appendonly") == "no" and not save.get("save"):
            return [NO_PERSISTENCE]
        return []

    async def _persistence(self) -> list[dict[str, str]]:
        # Two CONFIG GETs in one pipeline: several names in one call needs Redis 7.
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.config_get("appendonly")
            pipe.config_get("save")
            found: list[dict[str, str]] = await pipe.execute()
        return found

    async def ping(self) -> None:
        await self._call(self._client.ping)

    async def close(self) -> None:
        await self._client.aclose()


async def open_store(settings: Settings) -> Store:
    """A store on ``settings.redis_url`` (redis://, rediss:// or unix://).

    Connections open lazily, so an unreachable server surfaces on the first
    operation as :class:`StoreUnavailable`, not here.
    """
    pool = BlockingConnectionPool.from_url(
        settings.redis_url,
        # One connection per delivery in flight; heartbeats beyond that wait briefly.
        max_connections=settings.prefetch,
        timeout=POOL_WAIT,
        socket_connect_timeout=CONNECT_TIMEOUT,
        socket_timeout=COMMAND_TIMEOUT,
        # Never resend: a script that ran but whose reply was lost would run
        # twice, and a repeated complete would report a fence it lost to itself.
        retry=Retry(NoBackoff(), 0),
    )
    return RedisStore(store_config(settings), Redis.from_pool(pool))
