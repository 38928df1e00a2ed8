"""Script calls pipelined on one connection: replies in order, an error reply in its place,
the NOSCRIPT retry, ASKING, and the WAIT after them; several servers in one round trip."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest
from redis.exceptions import ConnectionError, MovedError, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from semel.stores.redis.eval import ASKING, Ran, Script, ScriptCall, pack, pack_script, run_scripts
from semel.stores.redis.wire import exchange, send

pytestmark = pytest.mark.timeout(10)

SCRIPT = Script("return 1")
WAIT = pack(b"WAIT", b"1", b"100")


class Scripted:
    """A pool of one fake connection answering each round with the next list of replies."""

    socket_timeout = 1.0
    is_connected = True

    def __init__(self, *rounds: Sequence[Any]) -> None:
        self.rounds = [list(r) for r in rounds]
        self.sent: list[bytes] = []
        self._replies: list[Any] = []
        self.dropped = False

    async def get_connection(self) -> Scripted:
        return self

    async def release(self, _: object) -> None:
        pass

    async def _send_packed_command(self, command: list[bytes]) -> None:
        self.sent.append(b"".join(command))
        self._replies = self.rounds.pop(0)

    async def disconnect(self, nowait: bool = False) -> None:
        self.dropped = True

    async def read_response(self, disable_decoding: bool, limit: float | None = None) -> Any:
        if not self._replies:  # a server that stopped answering
            await asyncio.Event().wait()
        reply = self._replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


def call(key: bytes, asking: bool = False) -> ScriptCall:
    return ScriptCall(SCRIPT, pack_script(SCRIPT, [key], []), asking)


async def run_one(pool: Scripted, calls: list[ScriptCall], wait: bytes | None = None) -> Ran:
    (ran,) = await run_scripts([(pool, calls)], wait)
    return ran


async def answered(
    pool: Scripted, calls: list[ScriptCall], wait: bytes | None = None
) -> tuple[list[Any], int | None]:
    ran = await run_one(pool, calls, wait)
    assert not isinstance(ran, Exception)
    return ran


async def test_replies_come_in_order_with_an_error_in_its_place() -> None:
    moved = MovedError("1 127.0.0.1:7001")
    pool = Scripted([b"a", moved, b"c", 1])
    replies, acked = await answered(pool, [call(b"a"), call(b"b"), call(b"c")], WAIT)
    assert (replies, acked) == ([b"a", moved, b"c"], 1)
    assert len(pool.sent) == 1  # one round trip


async def test_an_unknown_script_is_sent_again_as_eval_and_the_weakest_wait_counts() -> None:
    # The first round's write went unacknowledged; the retried call's was acknowledged.
    pool = Scripted([b"a", NoScriptError("NOSCRIPT"), 0], [b"b", 1])
    replies, acked = await answered(pool, [call(b"a"), call(b"b")], WAIT)
    assert (replies, acked) == ([b"a", b"b"], 0)
    assert pool.sent[1].startswith(call(b"b").script.as_eval(call(b"b").command))


async def test_asking_goes_before_its_call_and_its_answer_is_dropped() -> None:
    pool = Scripted([b"OK", NoScriptError("NOSCRIPT"), b"y"], [b"OK", b"x"])
    replies, acked = await answered(pool, [call(b"x", asking=True), call(b"y")])
    assert (replies, acked) == ([b"x", b"y"], None)
    assert pool.sent[0].startswith(ASKING)
    assert pool.sent[1].startswith(ASKING)  # an import's retry needs ASKING again


async def test_a_wait_a_demoted_primary_refuses_acknowledges_nothing() -> None:
    # A cluster replica answers MOVED for the calls and refuses the WAIT: the
    # redirections still count, and nothing is taken for replicated.
    moved = MovedError("1 127.0.0.1:7001")
    refused = ResponseError("WAIT cannot be used with replica instances. Please also note...")
    pool = Scripted([moved, b"read", refused])
    replies, acked = await answered(pool, [call(b"a"), call(b"b")], WAIT)
    assert (replies, acked) == ([moved, b"read"], 0)
    # Any other refusal of the WAIT (an ACL, say) is the call's answer.
    pool = Scripted([b"a", ResponseError("NOPERM no WAIT for you")])
    refusal = await run_one(pool, [call(b"a")], WAIT)
    assert isinstance(refusal, ResponseError)
    assert "NOPERM" in str(refusal)


async def test_the_replies_of_a_round_trip_share_one_deadline() -> None:
    # Two replies of three come; the third never does: the round trip ends at the
    # connection's socket timeout, as the store's timeout error.
    pool = Scripted([b"a", b"b"])
    pool.socket_timeout = 0.3
    started = time.monotonic()
    with pytest.raises(RedisTimeoutError):
        await send(pool, [b"x", b"y", b"z"])
    assert 0.3 <= time.monotonic() - started < 2
    assert pool.dropped  # its third reply may still come: never lent half read


async def test_several_servers_answer_in_one_round_trip_each_on_its_own() -> None:
    # One answers, one's connection fails, one never answers: each server's
    # answer is its own, and the silent one times out at the shared deadline.
    fine, failing, silent = Scripted([b"a"]), Scripted([ConnectionError("reset")]), Scripted([])
    for pool in (fine, failing, silent):
        pool.socket_timeout = 0.3
    started = time.monotonic()
    answers = await exchange([(fine, [b"x"]), (failing, [b"y"]), (silent, [b"z"])])
    assert 0.3 <= time.monotonic() - started < 2
    assert answers[0] == [b"a"]
    assert isinstance(answers[1], ConnectionError)
    assert isinstance(answers[2], RedisTimeoutError)
    assert [p.sent for p in (fine, failing, silent)] == [[b"x"], [b"y"], [b"z"]]
    assert silent.dropped
    assert not fine.dropped
