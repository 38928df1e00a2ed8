"""EVALSHA packed by the store, with only the work a script call needs.

redis-py's encoder takes any argument type, one argument at a time; with a
batch's hundreds of arguments it costs several times the packing of bytes
done here, and the arguments every call of a script shares are packed once
(:class:`Args`). The calls for one server (all of a batch on one server, a
node's share under Cluster) and the ``WAIT`` after them are written together
and cost one round trip (:mod:`semel.stores.redis.wire`), every server's at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

from redis.exceptions import NoScriptError, ResponseError

from semel.stores.redis.lender import Source
from semel.stores.redis.wire import exchange


class Script:
    """A Lua script as the server caches it: its text and that text's SHA1."""

    def __init__(self, text: str) -> None:
        self.text = text.encode()
        self.sha = hashlib.sha1(self.text, usedforsecurity=False).hexdigest().encode()
        self.sha_head = _bulk(b"EVALSHA") + _bulk(self.sha)
        self._eval_head = _bulk(b"EVAL") + _bulk(self.text)

    def as_eval(self, command: bytes) -> bytes:
        """``command`` (from :func:`pack_script`) as ``EVAL``: the text in place of the SHA."""
        head = command.index(b"\r\n") + 2  # past the argument count, which stays
        if not command.startswith(self.sha_head, head):
            raise ValueError("not an EVALSHA of this script")
        return command[:head] + self._eval_head + command[head + len(self.sha_head) :]


def _bulk(arg: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(arg), arg)


def _bulks(args: Sequence[bytes]) -> bytes:
    # Inline rather than _bulk per argument: a batch packs hundreds of them.
    return b"".join([b"$%d\r\n%s\r\n" % (len(a), a) for a in args])


def pack(*args: bytes) -> bytes:
    """One command in RESP; every argument is bytes already."""
    return b"*%d\r\n" % len(args) + _bulks(args)


class Args(NamedTuple):
    """Script arguments that never change, packed once: under Cluster a batch is a
    call per hash tag, and each would pack them again."""

    number: int
    packed: bytes

    @classmethod
    def of(cls, *args: bytes) -> Args:
        return cls(len(args), _bulks(args))


NO_ARGS = Args(0, b"")


def pack_script(
    script: Script, keys: Sequence[bytes], args: Sequence[bytes] = (), fixed: Args = NO_ARGS
) -> bytes:
    """``EVALSHA sha numkeys key... fixed... arg...`` in RESP."""
    count = 3 + len(keys) + fixed.number + len(args)
    return b"".join(
        (
            b"*%d\r\n" % count, script.sha_head, _bulk(b"%d" % len(keys)),
            _bulks(keys), fixed.packed, _bulks(args),
        )
    )  # fmt: skip


ASKING = pack(b"ASKING")
_WAIT_ON_REPLICA = "WAIT cannot be used with replica instances"


class ScriptCall(NamedTuple):
    """One packed EVALSHA; ``asking`` when a Cluster sent it to a slot being imported.

    A tuple, not a frozen dataclass: a Cluster batch makes one per hash tag, and a
    frozen dataclass costs several times as much to make.
    """

    script: Script
    command: bytes
    asking: bool = False

    def packed(self, as_eval: bool = False) -> list[bytes]:
        command = self.script.as_eval(self.command) if as_eval else self.command
        return [ASKING, command] if self.asking else [command]


Round = tuple[Source, Sequence[ScriptCall]]
"""Script calls for the server of a pool."""
Ran = tuple[list[Any], int | None] | Exception
"""A server's replies to its calls and its ``WAIT``'s count, or the error that cut it off."""


async def run_scripts(rounds: Sequence[Round], wait: bytes | None = None) -> list[Ran]:
    """Run each round's calls on its server, every server in one round trip (see
    :func:`semel.stores.redis.wire.exchange`); for each, the replies and the ``wait``'s.

    ``wait`` is a packed ``WAIT``, sent after a server's calls on the same
    connection: its reply counts the replicas that acknowledged every write the
    connection made. A server that does not know a script (restarted, failed
    over, or its cache flushed) refuses it before running anything, so sending
    the same keys and arguments again cannot run any key twice. The second try
    is an ``EVAL``, which carries the text and caches it: a ``SCRIPT LOAD``
    then ``EVALSHA`` could lose the script again to a flush in between.
    """
    ran = await _rounds(rounds, wait, as_eval=False)
    unknown: list[tuple[int, list[int]]] = []
    for i, answer in enumerate(ran):
        if not isinstance(answer, Exception):
            missing = [j for j, reply in enumerate(answer[0]) if isinstance(reply, NoScriptError)]
            if missing:
                unknown.append((i, missing))
    if not unknown:
        return ran
    again = [(rounds[i][0], [rounds[i][1][j] for j in js]) for i, js in unknown]
    for (i, js), second in zip(unknown, await _rounds(again, wait, as_eval=True), strict=True):
        first = ran[i]
        assert not isinstance(first, Exception)
        if isinstance(second, Exception):
            ran[i] = second  # the server was cut off: none of its replies stands
            continue
        replies, acked = first
        for j, reply in zip(js, second[0], strict=True):
            replies[j] = reply
        # The second round may borrow another connection: its WAIT covers its own
        # writes only, and the first round's covered the calls the server knew.
        if acked is not None and second[1] is not None:
            acked = min(acked, second[1])
        ran[i] = (replies, acked)
    return ran


async def _rounds(rounds: Sequence[Round], wait: bytes | None, *, as_eval: bool) -> list[Ran]:
    commands = []
    for _, calls in rounds:
        packed = [command for call in calls for command in call.packed(as_eval)]
        if wait is not None:
            packed.append(wait)
        commands.append(packed)
    answers = await exchange([(pool, c) for (pool, _), c in zip(rounds, commands, strict=True)])
    return [
        answer if isinstance(answer, Exception) else _replies(answer, calls, sent, wait)
        for answer, (_, calls), sent in zip(answers, rounds, commands, strict=True)
    ]


def _replies(
    replies: list[Any], calls: Sequence[ScriptCall], sent: list[bytes], wait: bytes | None
) -> Ran:
    acked = replies.pop() if wait is not None else None
    if isinstance(acked, ResponseError):
        if not str(acked).startswith(_WAIT_ON_REPLICA):
            return acked
        # A primary demoted under the store: nothing it holds is acknowledged, and
        # the calls' own replies (MOVED under Cluster) still say where to go.
        acked = 0
    if any(call.asking for call in calls):
        replies = [r for r, c in zip(replies, sent, strict=False) if c is not ASKING]
    return replies, acked
