"""EVALSHA on a pooled connection, with only the work a script call needs.

redis-py's ``execute_command`` wraps every command in a retry loop (which
the store sets to never resend), metric hooks and an encoder that accepts
any argument type, one argument at a time; with a batch's hundreds of
arguments that encoder costs several times the packing of bytes done here.
Script calls are packed once into RESP and written together, and their
replies read in order, on a connection borrowed from the client's own pool:
several calls to one server (a Cluster node's share of a batch) and the
``WAIT`` after them cost one round trip. The replies of a round trip share
one deadline, the connection's socket timeout, rather than one each: a
timer per reply cost a Cluster batch of 60 calls more than its parsing. The
connection layer still drops a connection on any error but a server error
reply, exactly as under ``execute_command`` (a deadline that passes cancels
the read, which drops it too), so a connection never goes back to the pool
half read; an error reply is read whole and handed back in place of its
call's reply.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import ConnectionPool
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError


class Script:
    """A Lua script as the server caches it: its text and that text's SHA1."""

    def __init__(self, text: str) -> None:
        self.text = text.encode()
        self.sha = hashlib.sha1(self.text, usedforsecurity=False).hexdigest().encode()
        self._sha_head = _bulk(b"EVALSHA") + _bulk(self.sha)
        self._eval_head = _bulk(b"EVAL") + _bulk(self.text)

    def as_eval(self, command: bytes) -> bytes:
        """``command`` (from :func:`pack_script`) as ``EVAL``: the text in place of the SHA."""
        head = command.index(b"\r\n") + 2  # past the argument count, which stays
        if not command.startswith(self._sha_head, head):
            raise ValueError("not an EVALSHA of this script")
        return command[:head] + self._eval_head + command[head + len(self._sha_head) :]


def _bulk(arg: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(arg), arg)


def pack(*args: bytes) -> bytes:
    """One command in RESP; every argument is bytes already."""
    # Inline rather than _bulk per argument: a batch packs hundreds of them.
    return b"*%d\r\n" % len(args) + b"".join([b"$%d\r\n%s\r\n" % (len(a), a) for a in args])


def pack_script(script: Script, keys: Sequence[bytes], args: Sequence[bytes]) -> bytes:
    """``EVALSHA sha numkeys key... arg...`` in RESP."""
    return pack(b"EVALSHA", script.sha, b"%d" % len(keys), *keys, *args)


ASKING = pack(b"ASKING")
_WAIT_ON_REPLICA = "WAIT cannot be used with replica instances"


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One packed EVALSHA; ``asking`` when a Cluster sent it to a slot being imported."""

    script: Script
    command: bytes
    asking: bool = False

    def packed(self, as_eval: bool = False) -> list[bytes]:
        command = self.script.as_eval(self.command) if as_eval else self.command
        return [ASKING, command] if self.asking else [command]


async def send(pool: ConnectionPool, commands: Sequence[bytes]) -> list[Any]:
    """Write ``commands`` at once and read a reply for each, in order.

    Replies come back as bytes whatever the URL asks the client to decode: the
    store reads them itself. An error reply is returned as its exception.
    """
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        await conn.send_packed_command(b"".join(commands))
        replies: list[Any] = []
        try:
            async with asyncio.timeout(conn.socket_timeout):
                for _ in commands:
                    try:
                        # No timer of its own (math.inf): the round trip's deadline holds.
                        replies.append(await conn.read_response(True, math.inf))
                    except ResponseError as error:  # read whole: the next reply follows
                        replies.append(error)
        except TimeoutError:  # the read was cancelled, and the connection dropped
            raise RedisTimeoutError(f"Timeout reading from {_where(conn)}") from None
        return replies
    finally:
        await pool.release(conn)


def _where(conn: Any) -> str:
    host, port = getattr(conn, "host", None), getattr(conn, "port", None)
    return f"{host}:{port}" if host else "the Redis server"


async def run_scripts(
    pool: ConnectionPool, calls: Sequence[ScriptCall], wait: bytes | None = None
) -> tuple[list[Any], int | None]:
    """Run ``calls`` on one server in one round trip; their replies, and the ``wait``'s.

    ``wait`` is a packed ``WAIT``, sent after the calls on the same connection:
    its reply counts the replicas that acknowledged every write the connection
    made. A server that does not know a script (restarted, failed over, or its
    cache flushed) refuses it before running anything, so sending the same
    keys and arguments again cannot run any key twice. The second try is an
    ``EVAL``, which carries the text and caches it: a ``SCRIPT LOAD`` then
    ``EVALSHA`` could lose the script again to a flush in between.
    """
    replies, acked = await _round(pool, calls, wait, as_eval=False)
    unknown = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if unknown:
        again, acked_again = await _round(pool, [calls[i] for i in unknown], wait, as_eval=True)
        for i, reply in zip(unknown, again, strict=True):
            replies[i] = reply
        # The second round may borrow another connection: its WAIT covers its own
        # writes only, and the first round's covered the calls the server knew.
        if acked is not None and acked_again is not None:
            acked = min(acked, acked_again)
    return replies, acked


async def _round(
    pool: ConnectionPool, calls: Sequence[ScriptCall], wait: bytes | None, *, as_eval: bool
) -> tuple[list[Any], int | None]:
    commands = [packed for call in calls for packed in call.packed(as_eval)]
    if wait is not None:
        commands.append(wait)
    replies = await send(pool, commands)
    acked = replies.pop() if wait is not None else None
    if isinstance(acked, ResponseError):
        if not str(acked).startswith(_WAIT_ON_REPLICA):
            raise acked
        # A primary demoted under the store: nothing it holds is acknowledged, and
        # the calls' own replies (MOVED under Cluster) still say where to go.
        acked = 0
    if any(call.asking for call in calls):
        replies = [r for r, c in zip(replies, commands, strict=False) if c is not ASKING]
    return replies, acked
