"""The Redis store on a Redis Cluster: a batch split by hash slot, one round trip per node.

A key is stored under one of 64 hash tags (:mod:`semel.stores.redis.buckets`),
``<prefix>:{<tag>}:<key>``. A script call may only take keys of one slot,
so a batch becomes one call per tag its keys fall in (at most 64), each the
batch script over its keys and deciding each key as if alone; the calls for
one node go out together, with the ``WAIT`` of the writes, and are answered
together: a batch costs one round trip per node it touches, taken side by
side.

Redirections are followed where they prove the call did not run: ``MOVED``
(the slot is served elsewhere now: the map learns it) and ``ASK`` (the
slot is being imported by another node: ``ASKING`` then the call, there),
up to :data:`REDIRECTS` times. Nothing else is sent twice: a call whose
node stopped answering may have run, and the store answers that the store
is away (``StoreUnavailable``) for the whole batch, as it does for
``TRYAGAIN``, ``CLUSTERDOWN`` and redirections past the budget; the claims
of the batch that were granted are given back (:mod:`semel.stores.redis.base`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Sequence
from typing import Any, TypeVar

from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, ReadOnlyError

from semel.stores.base import StoreConfig
from semel.stores.redis.base import Call, RedisScripts
from semel.stores.redis.buckets import layout, stored_key
from semel.stores.redis.eval import Script, ScriptCall, pack
from semel.stores.redis.setup import merged, server_facts, warnings_of
from semel.stores.redis.slots import SlotMap
from semel.stores.redis.url import Address, RedisTarget
from semel.stores.redis.wire import send

T = TypeVar("T")

REDIRECTS = 3
"""Redirections one call follows (a MOVED, then an ASK, then one more), then it is given up."""

CLUSTER_INFO = pack(b"CLUSTER", b"INFO")
_TOPOLOGY_CHANGED = (ClusterDownError, ReadOnlyError)  # the map may be wrong: read it again


class RedisClusterStore(RedisScripts):
    """The store on the cluster ``target`` names, pooling ``connections`` per node."""

    cluster = True

    def __init__(
        self, config: StoreConfig, target: RedisTarget, connections: int, replicas_ack: int = 0
    ) -> None:
        super().__init__(config, replicas_ack)
        self._slots = SlotMap(target, connections)

    def _key(self, key: str) -> bytes:
        return stored_key(self._prefix, key)

    def _layout(self, keys: Sequence[str]) -> tuple[list[bytes], list[list[int]]]:
        return layout(self._prefix, keys)

    async def _run(self, script: Script, calls: Sequence[Call], *, write: bool = True) -> list[Any]:
        await self._slots.ready()
        slots = [key_slot(first) for first, _ in calls]
        replies: list[Any] = [None] * len(calls)
        todo = {i: ScriptCall(script, command) for i, (_, command) in enumerate(calls)}
        asked: dict[int, Address] = {}
        for _ in range(REDIRECTS + 1):
            nodes: dict[Address, list[int]] = {}
            for i in todo:
                try:
                    node = asked.get(i) or self._slots.node(slots[i])
                except ClusterDownError as exc:  # a slot nobody serves: that call fails alone
                    replies[i] = exc
                    continue
                nodes.setdefault(node, []).append(i)
            answers = await self._nodes(nodes, todo, write)
            redirected: dict[int, ScriptCall] = {}
            asked = {}
            for part, answer in zip(nodes.values(), answers, strict=True):
                for i, reply in zip(part, answer, strict=True):
                    replies[i] = reply  # a redirection past the budget is the answer
                    if isinstance(reply, AskError):
                        redirected[i] = self._redirect(i, reply, todo[i], asked)
                    elif isinstance(reply, _TOPOLOGY_CHANGED):
                        self._slots.forget()
            todo = redirected
            if not todo:
                break
        return replies

    def _redirect(
        self, i: int, reply: AskError, call: ScriptCall, asked: dict[int, Address]
    ) -> ScriptCall:
        """The call to send again after ``reply`` proved it did not run."""
        if isinstance(reply, MovedError):
            self._slots.moved(reply.slot_id, reply.node_addr)
            return call._replace(asking=False)
        asked[i] = reply.node_addr  # once, there: the slot stays the other node's meanwhile
        return call._replace(asking=True)

    async def _nodes(
        self, nodes: dict[Address, list[int]], todo: dict[int, ScriptCall], write: bool
    ) -> list[list[Any]]:
        """Each node's replies to its calls, all in one round trip; for a node that was
        cut off, the error for each of its calls."""
        rounds = [(self._slots.pool(node), [todo[i] for i in part]) for node, part in nodes.items()]
        answers = await self._waited(rounds, write)
        replies: list[list[Any]] = []
        for part, answer in zip(nodes.values(), answers, strict=True):
            if isinstance(answer, Exception):  # the calls may have run: none is sent again
                self._slots.forget()
                answer = [answer] * len(part)
            replies.append(answer)
        return replies

    async def ping(self) -> None:
        """Every primary answers and says the cluster is ``ok``: a primary away, or a
        cluster that refuses commands, is a store that is away."""
        await self._call(self._ping)

    async def _ping(self) -> None:
        await self._slots.ready()
        primaries = self._slots.primaries
        try:
            answers = await _every(
                send(self._slots.pool(node), [CLUSTER_INFO]) for node in primaries
            )
        except Exception:
            self._slots.forget()
            raise
        for (host, port), (reply,) in zip(primaries, answers, strict=True):
            if isinstance(reply, Exception):
                raise reply
            if b"cluster_state:ok" not in reply:
                self._slots.forget()
                raise ClusterDownError(f"{host}:{port} says the cluster is not ok")

    async def warnings(self) -> list[str]:
        """What every primary's set-up risks, each warning said once with its primaries."""

        async def read() -> list[tuple[str, list[str]]]:
            await self._slots.ready()
            primaries = self._slots.primaries
            facts = await _every(server_facts(self._slots.pool(n)) for n in primaries)
            return [
                (f"{host}:{port}", warnings_of(found, self.replicas_ack))
                for (host, port), found in zip(primaries, facts, strict=True)
            ]

        return merged(await self._call(read))

    async def close(self) -> None:
        await self._slots.close()


async def _every(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Each call's answer, once every call has ended; else the first error.

    Not a bare ``gather``: it raises the first error at once and leaves the
    other calls running with nobody waiting for them, which can outlive the
    store's close and open a connection after it.
    """
    answers = await asyncio.gather(*calls, return_exceptions=True)
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    return answers  # type: ignore[return-value]  # no error among them
