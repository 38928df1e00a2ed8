"""EVALSHA on a pooled connection, with only the work a script call needs.

redis-py's ``execute_command`` wraps every command in a retry loop (which
the store sets to never resend), metric hooks and an encoder that accepts
any argument type, one argument at a time; with a batch's hundreds of
arguments that encoder costs several times the packing of bytes done here.
A script call is packed once into RESP, written, and its one reply read,
on a connection borrowed from the client's own pool. The connection layer
still drops a connection on any error but a server error reply, exactly as
under ``execute_command``, so a connection never goes back to the pool
half read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from redis.asyncio import ConnectionPool
from redis.exceptions import NoScriptError


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
    return b"".join((b"*%d\r\n" % len(args), *map(_bulk, args)))


def pack_script(script: Script, keys: Sequence[bytes], args: Sequence[bytes]) -> bytes:
    """``EVALSHA sha numkeys key... arg...`` in RESP."""
    return pack(b"EVALSHA", script.sha, b"%d" % len(keys), *keys, *args)


async def evalsha(pool: ConnectionPool, script: Script, command: bytes) -> Any:
    """Send ``command`` (from :func:`pack_script`) and return the script's reply.

    Replies come back as bytes whatever the URL asks the client to decode:
    the store reads its scripts' replies itself. A server that does not know
    the script (restarted, failed over, or its cache flushed) refuses it
    before running anything, so sending the same keys and arguments again
    cannot run any key twice. The second try is an ``EVAL``, which carries
    the text and caches it: a ``SCRIPT LOAD`` then ``EVALSHA`` could lose
    the script again to a flush in between.
    """
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        await conn.send_packed_command(command)
        try:
            return await conn.read_response(disable_decoding=True)
        except NoScriptError:
            await conn.send_packed_command(script.as_eval(command))
            return await conn.read_response(disable_decoding=True)
    finally:
        await pool.release(conn)
