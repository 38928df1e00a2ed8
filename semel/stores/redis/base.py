"""The Redis store's contract in Lua scripts, wherever the scripts run.

A record is a single hash at ``<prefix>:<key>``. Each operation is one
EVALSHA of a script in ``semel/stores/redis/scripts/``: the claim inspects, takes
over or refuses and returns the record in the same round trip. Leases are
server-clock milliseconds (``TIME``); retention is the key's own expiry,
refreshed by every write, so Redis forgets finished keys by itself. A key
claimed with no hash starts its fence at the same clock in microseconds, so a
key forgotten (expired, evicted, lost in a failover) and claimed again is
granted a fence above every one it had, unless the server's clock went back
across the gap by more than the time since the key's first claim.

A batch (``claim_many`` / ``complete_many``) runs the same script over
several keys in one call, each key decided as if alone, since a script runs
atomically as a whole. Which keys one call may take is the subclass's to
say (:meth:`RedisScripts._layout`), and where a call runs
(:meth:`RedisScripts._run`): one server takes a whole batch
(:mod:`semel.stores.redis.store`), a Redis Cluster one hash slot per call
(:mod:`semel.stores.redis.cluster`). Every script touches only the keys it
declares.

With ``replicas_ack`` every write is followed, in the same round trip, by a
``WAIT`` for that many replicas; fewer acknowledgements make the call fail
as the store being away (:class:`semel.stores.redis.errors.NotReplicated`), never
a write reported safe, and the claims it granted are given back.

The server's errors are sorted in :mod:`semel.stores.redis.errors`. A key that a
foreign value of another type holds is refused on its own: a batch script
reads every key before it writes any and answers such a key with a marker,
and a single-key script fails on its first read of it, before any write.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeGuard, TypeVar

from redis.exceptions import RedisError

from semel.stores.base import (
    POISON_ERROR,
    Claim,
    ClaimRequest,
    Completion,
    Outcome,
    Record,
    Store,
    StoreConfig,
)
from semel.stores.errors import KeyRefused, StoreError
from semel.stores.redis.errors import NotReplicated, store_error
from semel.stores.redis.eval import Args, Round, Script, pack, pack_script, run_scripts
from semel.stores.redis.replies import decode_claims, decode_completions, decode_record
from semel.stores.redis.wire import Replies

WAIT_LIMIT = 2.0
"""Seconds a ``WAIT`` may take at most: its reply must come before the socket's timeout."""

_SCRIPTS = Path(__file__).with_name("scripts")

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
GIVE_BACK = _lua("common", "fenced", "give_back")
FAIL = _lua("common", "fenced", "fail")
HEARTBEAT = _lua("common", "fenced", "heartbeat")
RESET = _lua("common", "reset")

Call = tuple[bytes, bytes]
"""One script call: its first key (which names the slot under Cluster) and the packed EVALSHA."""


def _sortable(exc: Exception) -> TypeGuard[RedisError | OSError]:
    return isinstance(exc, RedisError | OSError)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def wait_timeout(config: StoreConfig) -> float:
    """Seconds a write waits for its replicas: half a store call's deadline, at most
    :data:`WAIT_LIMIT`, so a write that is not replicated still answers in time."""
    return min(config.call_deadline / 2, WAIT_LIMIT)


class RedisScripts(Store):
    """The store contract on Redis 5 or later, in Lua scripts; a subclass says where
    a script runs (:meth:`_run`) and which keys one call may take (:meth:`_layout`).

    From 5 on, scripts replicate by their effects, so a script may read
    ``TIME`` and then write.
    """

    backend = "redis"
    cluster = False  # how the server's errors read (semel.stores.redis.errors)
    # result_limit stays None: a Redis string holds 512 MB, beyond any sane result.

    def __init__(self, config: StoreConfig, replicas_ack: int = 0) -> None:
        super().__init__(config)
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
        self._max_claims = b"%d" % config.max_claims
        self._heartbeat_args = (lock, live)
        self._claim_args = Args.of(
            lock, self._retention, live, self._max_claims, POISON_ERROR.encode()
        )
        self._complete_args = Args.of(self._retention)
        self.replicas_ack = replicas_ack
        self._wait_ms = _ms(wait_timeout(config))
        self._wait = pack(b"WAIT", b"%d" % replicas_ack, b"%d" % self._wait_ms)

    def _key(self, key: str) -> bytes:
        return self._prefix + key.encode()

    def _layout(self, keys: Sequence[str]) -> tuple[list[bytes], list[list[int]]]:
        """``keys`` as stored (:meth:`_key`), and their positions that one script call may
        take together, in parts: all of them in one, unless the subclass says otherwise."""
        prefix = self._prefix  # _key inlined: this runs for every key of a batch
        return [prefix + k.encode() for k in keys], [list(range(len(keys)))]

    @abc.abstractmethod
    async def _run(self, script: Script, calls: Sequence[Call], *, write: bool = True) -> list[Any]:
        """Run ``calls`` of ``script``; a reply per call, an error reply as its exception.

        A ``write`` is followed by the ``WAIT`` its replicas are asked for
        (:meth:`_waited`). Raises when no server could be asked at all.
        """

    async def _waited(self, rounds: Sequence[Round], write: bool) -> list[Replies]:
        """Each round's calls run on its server, all in one round trip (with the ``WAIT``
        of a ``write``): for each server its replies, or the error that cut it off. A
        reply whose write too few replicas acknowledged comes back wrapped in
        :class:`NotReplicated`."""
        wait = self._wait if write and self.replicas_ack else None
        answers: list[Replies] = []
        for ran in await run_scripts(rounds, wait):
            if isinstance(ran, Exception):
                answers.append(ran)
                continue
            replies, acked = ran
            if acked is not None and acked < self.replicas_ack:
                replies = [
                    r
                    if isinstance(r, Exception)
                    else NotReplicated(acked, self.replicas_ack, self._wait_ms, r)
                    for r in replies
                ]
            answers.append(replies)
        return answers

    async def _call(self, operation: Callable[[], Awaitable[T]], key: str | None = None) -> T:
        """Run ``operation``, its server's errors sorted (see :mod:`semel.stores.redis.errors`);
        ``key`` is the one key of a single-key script."""
        try:
            return await operation()
        except (RedisError, OSError) as exc:
            self._raise(exc, key)

    def _raise(self, exc: Exception, key: str | None = None) -> NoReturn:
        """Raise the store error ``exc`` stands for; ``exc`` itself when it is none."""
        error = store_error(self.backend, exc, key, self.cluster) if _sortable(exc) else None
        if error is None:
            raise exc
        raise error from exc

    async def _eval(
        self,
        script: Script,
        keys: Sequence[bytes],
        args: Sequence[bytes],
        key: str | None = None,
        *,
        write: bool = True,
    ) -> Any:
        """One single-key script call: its reply, or its error raised sorted; a ``write``
        waits for its replicas."""
        call = (keys[0], pack_script(script, keys, args))

        async def run() -> Any:
            (reply,) = await self._run(script, [call], write=write)
            if isinstance(reply, Exception):
                raise reply
            return reply

        return await self._call(run, key)

    async def _batch(
        self,
        script: Script,
        names: Sequence[str],
        fixed: Args,
        args: Callable[[list[int]], list[bytes]],
    ) -> tuple[list[list[int]], list[Any]]:
        """``script`` over the keys ``names``, split as :meth:`_layout` says; ``fixed``
        the arguments of every call, then ``args`` a part's own. The parts, and a reply
        or an error for each."""
        keys, parts = self._layout(names)
        whole = len(parts) == 1  # no copy of the keys for the usual case
        calls = []
        for part in parts:
            part_keys = keys if whole else [keys[i] for i in part]
            calls.append((part_keys[0], pack_script(script, part_keys, args(part), fixed)))
        return parts, await self._call(lambda: self._run(script, calls))

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Claim | KeyRefused]:
        if not requests:
            return []

        def args(part: list[int]) -> list[bytes]:
            return [requests[i].fingerprint.encode() for i in part]

        keys = [r.key for r in requests]
        parts, replies = await self._batch(CLAIM, keys, self._claim_args, args)
        claims: list[Claim | KeyRefused | None] = [None] * len(requests)
        failure: Exception | None = None
        for part, reply in zip(parts, replies, strict=True):
            if isinstance(reply, Exception):
                failure = failure or reply
                if not isinstance(reply, NotReplicated):
                    continue
                reply = reply.reply
            decided = decode_claims(
                [requests[i] for i in part], reply, self._lock_ms, self._live_ms
            )
            for i, claim in zip(part, decided, strict=True):
                claims[i] = claim
        if failure is not None:
            await self._give_back(c for c in claims if isinstance(c, Claim))
            self._raise(failure)
        return claims  # type: ignore[return-value]  # every part answered

    async def _give_back(self, claims: Iterable[Claim]) -> None:
        """Hand back the claims a failed batch granted after all, uncounted (give_back.lua),
        so their keys are free at once rather than when their leases run out, and an
        outage never poisons them. Best effort: else their leases run out."""

        async def release(claim: Claim) -> None:
            # Not waiting for replicas: a give-back lost in a failover leaves the key
            # to its lease, which is all a give-back that did not land does too.
            with contextlib.suppress(StoreError, RedisError, OSError):
                key, fence = claim.record.key, b"%d" % claim.fence
                args = [fence, self._retention]
                await self._eval(GIVE_BACK, [self._key(key)], args, key, write=False)

        granted = [release(c) for c in claims if c.outcome is Outcome.CLAIMED]
        await asyncio.gather(*granted)

    async def complete_many(self, completions: Sequence[Completion]) -> list[bool | KeyRefused]:
        if not completions:
            return []

        def args(part: list[int]) -> list[bytes]:
            packed: list[bytes] = []
            for i in part:
                packed += (b"%d" % completions[i].fence, completions[i].data)
            return packed

        keys = [c.key for c in completions]
        parts, replies = await self._batch(COMPLETE, keys, self._complete_args, args)
        for reply in replies:
            if isinstance(reply, Exception):  # written or not, the caller retries it all
                self._raise(reply)
        if len(parts) == 1:
            return decode_completions(completions, replies[0])
        written: list[bool | KeyRefused] = [False] * len(completions)
        for part, reply in zip(parts, replies, strict=True):
            answers = decode_completions([completions[i] for i in part], reply)
            for i, answer in zip(part, answers, strict=True):
                written[i] = answer
        return written

    async def _fenced(self, script: Script, key: str, *args: bytes) -> bool:
        return bool(await self._eval(script, [self._key(key)], args, key))

    async def release(self, key: str, fence: int) -> bool:
        return await self._fenced(RELEASE, key, b"%d" % fence, self._retention)

    async def fail(self, key: str, fence: int, error: str) -> bool:
        return await self._fenced(FAIL, key, b"%d" % fence, self._retention, error.encode())

    async def heartbeat(self, key: str, fence: int) -> bool:
        return await self._fenced(HEARTBEAT, key, b"%d" % fence, *self._heartbeat_args)

    async def get(self, key: str) -> Record | None:
        reply = await self._eval(GET, [self._key(key)], (), key, write=False)
        if reply is None:
            return None
        return decode_record(key, reply)

    async def reset(self, key: str, fingerprint: str | None = None) -> bool:
        # No third argument keeps the record's fingerprint (an empty one is a value).
        edited = () if fingerprint is None else (fingerprint.encode(),)
        return await self._fenced(RESET, key, self._retention, self._max_claims, *edited)

    async def migrate(self) -> list[str]:
        """Nothing to create; check the server answers, and say what its set-up risks."""
        await self.ping()
        return await self.warnings()
