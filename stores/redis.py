"""The Redis store: one hash per key, every decision taken inside a Lua script.

A record is a single hash at ``<prefix>:<key>``. Each operation is one
EVALSHA of a script in ``stores/redis_scripts/``: the claim inspects, takes
over or refuses and returns the record in the same round trip. Leases are
server-clock milliseconds (``TIME``); retention is the key's own expiry,
refreshed by every write, so Redis forgets finished keys by itself.

A batch (``claim_many`` / ``complete_many``) is one EVALSHA of the same
script over all its keys: one round trip and one reply to decode, and each
key decided as if alone, since a script runs atomically as a whole (it also
holds the server that long: a few milliseconds for a few hundred keys).
That assumes one server holds every key: a standalone Redis, which is what
:func:`open_store` connects to, or one that Sentinel fails over. A Redis
Cluster refuses a script whose keys span hash slots (CROSSSLOT), and the
distinct keys of a batch nearly always do; there a batch would have to be
split by slot, about one call per key again. A single-key call's script
touches only its own key, as Cluster would require.

The server's errors are sorted in :mod:`stores.redis_errors`. A key that a
foreign value of another type holds is refused on its own: a batch script
reads every key before it writes any and answers such a key with a marker,
and a single-key script fails on its first read of it, before any write.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import orjson
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError

from stores.base import (
    POISON_ERROR,
    Claim,
    ClaimRequest,
    Completion,
    Outcome,
    Record,
    Status,
    Store,
    StoreConfig,
)
from stores.codec import from_epoch_ms
from stores.errors import KeyRefused
from stores.redis_errors import foreign, passes, store_error
from stores.redis_eval import Script, evalsha, pack_script

CONNECT_TIMEOUT = 2.0
"""Seconds to open a connection: a stopped server shows up this fast."""
COMMAND_TIMEOUT = 3.0
"""Seconds to wait for a reply; a script never runs near this long."""
POOL_WAIT = 5.0
"""Seconds an operation waits for a free pooled connection; then the store counts as down."""

NO_PERSISTENCE = "Redis keeps nothing on disk: a restart forgets every key"
EVICTING = (
    "maxmemory-policy {policy} lets Redis evict semel's keys when memory runs short: "
    "a late copy of an evicted completed key runs its handler again, and an evicted "
    "claim's fence starts again at 1; set maxmemory-policy noeviction (a full Redis "
    "then pauses consumption instead)"
)

_SCRIPTS = Path(__file__).with_name("redis_scripts")

T = TypeVar("T")


def _lua(*names: str) -> Script:
    """The scripts ``names`` as one script; the first ones define what the last uses."""
    return Script("\n".join((_SCRIPTS / f"{n}.lua").read_text(encoding="utf-8") for n in names))


# common.lua: the server clock and number formatting; record.lua: the record
# as a reply; fenced.lua: the check that only the current claim writes a key.
CLAIM = _lua("common", "record", "claim")
GET = _lua("common", "record", "get")
COMPLETE = _lua("common", "fenced", "complete")
RELEASE = _lua("common", "fenced", "release")
FAIL = _lua("common", "fenced", "fail")
HEARTBEAT = _lua("common", "fenced", "heartbeat")
RESET = _lua("common", "reset")

_WRITTEN = ord("1")  # complete.lua's answer for a key it wrote
_REFUSED = ord("R")  # and for a key a foreign value holds
# Looked up per key of a batch; a dict is several times cheaper than Enum(value).
_STATUS = {s.value: s for s in Status}
_OUTCOME = {o.value: o for o in Outcome}


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _record(key: str, now: int, answer: Sequence[Any]) -> Record:
    """Build a record from a record_json answer (see record.lua for its shape)."""
    _, pttl, fingerprint, status, fence, claims, lease, result, error, first, updated = answer
    return Record(
        key=key,
        fingerprint=fingerprint,
        status=_STATUS[status],
        fence=fence,
        claims=claims,
        lease_expires_at=from_epoch_ms(lease),
        result=result,
        error=error,
        first_seen=from_epoch_ms(first),
        updated_at=from_epoch_ms(updated),
        # PTTL is -1 when someone removed the expiry by hand: nothing will forget it.
        expires_at=from_epoch_ms(now + pttl) if pttl >= 0 else None,
    )


class RedisStore(Store):
    """The store contract on Redis 5 or later.

    From 5 on, scripts replicate by their effects, so a script may read
    ``TIME`` and then write.
    """

    backend = "redis"
    # result_limit stays None: a Redis string holds 512 MB, beyond any sane result.

    def __init__(self, config: StoreConfig, client: Redis) -> None:
        super().__init__(config)
        self._client = client
        self._pool = client.connection_pool
        # config.namespaced(key), as bytes, built without a format per key.
        self._prefix = config.namespaced("").encode()
        self._retention_ms = _ms(config.retention)
        self._lock_ms = _ms(config.lock_ttl)
        # A live lease must never outlast its record, or a fresh claim could
        # reuse the fence its still-running owner holds.
        self._live_ms = max(self._retention_ms, self._lock_ms)
        # Script arguments that never change, encoded once.
        lock, live = b"%d" % self._lock_ms, b"%d" % self._live_ms
        self._retention = b"%d" % self._retention_ms
        self._heartbeat_args = (lock, live)
        self._claim_args = (
            lock, self._retention, live, b"%d" % config.max_claims, POISON_ERROR.encode()
        )  # fmt: skip

    def _key(self, key: str) -> bytes:
        return self._prefix + key.encode()

    async def _call(self, operation: Callable[[], Awaitable[T]], key: str | None = None) -> T:
        """Run ``operation``, its server's errors sorted (see :mod:`stores.redis_errors`);
        ``key`` is the one key of a single-key script."""
        try:
            return await operation()
        except (RedisError, OSError) as exc:
            error = store_error(self.backend, exc, key)
            if error is None:
                raise
            raise error from exc

    async def _eval(
        self, script: Script, keys: Sequence[bytes], args: Sequence[bytes], key: str | None = None
    ) -> Any:
        command = pack_script(script, keys, args)
        return await self._call(lambda: evalsha(self._pool, script, command), key)

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Claim | KeyRefused]:
        if not requests:
            return []
        reply = await self._eval(
            CLAIM,
            [self._key(r.key) for r in requests],
            [*self._claim_args, *(r.fingerprint.encode() for r in requests)],
        )
        now, *answers = orjson.loads(reply)
        claims: list[Claim | KeyRefused] = []
        fresh: Callable[[ClaimRequest], Claim] | None = None
        for request, answer in zip(requests, answers, strict=True):
            if answer == 0:
                fresh = fresh or self._fresh(now)
                claims.append(fresh(request))
            elif type(answer) is str:  # the type of a foreign value at the key
                claims.append(KeyRefused(request.key, foreign(answer)))
            else:
                claims.append(Claim(_OUTCOME[answer[0]], _record(request.key, now, answer)))
        return claims

    def _fresh(self, now: int) -> Callable[[ClaimRequest], Claim]:
        """First claims of absent keys at ``now``, as claim.lua wrote them."""
        at = from_epoch_ms(now)
        lease = from_epoch_ms(now + self._lock_ms)
        expires = from_epoch_ms(now + self._live_ms)

        def claim(request: ClaimRequest) -> Claim:
            record = Record(
                request.key, request.fingerprint, Status.IN_PROGRESS, 1, 1, lease, None, None,
                at, at, expires,
            )  # fmt: skip
            return Claim(Outcome.CLAIMED, record)

        return claim

    async def complete_many(self, completions: Sequence[Completion]) -> list[bool | KeyRefused]:
        if not completions:
            return []
        args = [self._retention]
        for c in completions:
            args += (b"%d" % c.fence, c.data)
        reply: bytes = await self._eval(COMPLETE, [self._key(c.key) for c in completions], args)
        if _REFUSED not in reply:
            return [flag == _WRITTEN for flag in reply]
        return [
            KeyRefused(c.key, foreign()) if flag == _REFUSED else flag == _WRITTEN
            for c, flag in zip(completions, reply, strict=True)
        ]

    async def _fenced(self, script: Script, key: str, *args: bytes) -> bool:
        return bool(await self._eval(script, [self._key(key)], args, key))

    async def release(self, key: str, fence: int) -> bool:
        return await self._fenced(RELEASE, key, b"%d" % fence, self._retention)

    async def fail(self, key: str, fence: int, error: str) -> bool:
        return await self._fenced(FAIL, key, b"%d" % fence, self._retention, error.encode())

    async def heartbeat(self, key: str, fence: int) -> bool:
        return await self._fenced(HEARTBEAT, key, b"%d" % fence, *self._heartbeat_args)

    async def get(self, key: str) -> Record | None:
        reply = await self._eval(GET, [self._key(key)], (), key)
        if reply is None:
            return None
        now, answer = orjson.loads(reply)
        return _record(key, now, answer)

    async def reset(self, key: str) -> bool:
        return await self._fenced(RESET, key, self._retention)

    async def migrate(self) -> list[str]:
        """Nothing to create; check the server answers, and say what its set-up risks."""
        await self.ping()
        return await self.warnings()

    async def warnings(self) -> list[str]:
        found = await self._call(self._persistence)
        if found is None:
            return []  # managed Redis often disables CONFIG; no way to tell, no warning
        appendonly, save, memory = found
        said = []
        if appendonly.get("appendonly") == "no" and not save.get("save"):
            said.append(NO_PERSISTENCE)
        policy = memory.get("maxmemory-policy", "noeviction")
        if policy != "noeviction":
            said.append(EVICTING.format(policy=policy))
        return said

    async def _persistence(self) -> list[dict[str, str]] | None:
        # CONFIG GETs in one pipeline: several names in one call needs Redis 7.
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.config_get("appendonly")
            pipe.config_get("save")
            pipe.config_get("maxmemory-policy")
            try:
                found: list[dict[str, str]] = await pipe.execute()
            except ResponseError as exc:
                if passes(exc):
                    raise
                return None  # CONFIG disabled, renamed or not granted
        return found

    async def ping(self) -> None:
        await self._call(self._client.ping)

    async def close(self) -> None:
        await self._client.aclose()


async def open_store(*, url: str, connections: int, config: StoreConfig) -> Store:
    """A store on ``url`` (redis://, rediss:// or unix://), pooling up to ``connections``.

    Connections open lazily, so an unreachable server surfaces on the first
    operation as :class:`StoreUnavailable`, not here.
    """
    pool = BlockingConnectionPool.from_url(
        url,
        # One connection per delivery in flight; heartbeats beyond that wait briefly.
        max_connections=connections,
        timeout=POOL_WAIT,
        socket_connect_timeout=CONNECT_TIMEOUT,
        # Never past a third of the lease: a reply that late is abandoned anyway.
        socket_timeout=min(COMMAND_TIMEOUT, config.call_deadline),
        # Never resend: a script that ran but whose reply was lost would run
        # twice, and a repeated complete would report a fence it lost to itself.
        # Scripts bypass the client's retry loop (stores.redis_eval); ping and
        # CONFIG GET still go through it.
        retry=Retry(NoBackoff(), 0),
    )
    return RedisStore(config, Redis.from_pool(pool))
