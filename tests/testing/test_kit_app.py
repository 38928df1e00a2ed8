"""The testing kit runs an app as ``semel consume`` plans it: a message goes to the
handler whose queue its routing key is bound to, each with its own settings."""

from __future__ import annotations

import pytest

from semel.consumer import App, Context
from semel.consumer.names import Reason
from semel.consumer.testing import HandlerKit, SyncHandlerKit

pytestmark = pytest.mark.timeout(20)

app = App()
ran: list[str] = []


@app.handler("orders.paid")
async def charge(context: Context) -> str:
    ran.append(f"charge {context.key}")
    return "charged"


@app.handler("orders.paid", "orders.refunded", max_attempts=1)
def audit(context: Context) -> None:
    ran.append(f"audit {context.key}")
    if context.body.get("fail"):
        raise RuntimeError("audit log full")


@app.handler("users.#", name="signup", queue="users", type="UserCreated")
@app.handler("users.#", name="other_users", queue="users", type="UserDeleted")
async def users(context: Context) -> None:
    ran.append(f"users {context.key}")


@pytest.fixture(autouse=True)
def fresh() -> None:
    ran.clear()


async def test_each_handler_runs_once_per_key_and_a_fan_out_is_named() -> None:
    async with HandlerKit(app) as kit:
        with pytest.raises(ValueError, match=r"reaches the queues of \['charge', 'audit'\]"):
            await kit.send({}, key="k1", routing_key="orders.paid")
        charged = await kit.send({}, key="k1", routing_key="orders.paid", handler="charge")
        audited = await kit.send({}, key="k1", routing_key="orders.paid", handler="audit")
        again = await kit.send({}, key="k1", routing_key="orders.paid", handler="charge")
        refunded = await kit.send({"fail": True}, key="k2", routing_key="orders.refunded")
        with pytest.raises(LookupError, match="unroutable"):
            await kit.send({}, key="k3", routing_key="orders.lost")
    assert (charged.acked, charged.handler, charged.key, charged.stored) == (
        True, "charge", "k1", "charged",
    )  # fmt: skip
    assert audited.acked
    assert audited.handler == "audit"
    assert again.duplicate
    assert (refunded.dead_lettered, refunded.reason) == (True, Reason.MAX_ATTEMPTS)  # 1 attempt
    assert ran == ["charge k1", "audit k1", "audit k2"]


def test_a_shared_queue_picks_by_type_and_dead_letters_what_no_handler_takes() -> None:
    with SyncHandlerKit(app) as kit:
        created = kit.send({}, key="u1", routing_key="users.eu", type="UserCreated")
        deleted = kit.send({}, key="u1", routing_key="users.eu", type="UserDeleted")
        renamed = kit.send({}, key="u2", routing_key="users.eu", type="UserRenamed")
    assert (created.handler, deleted.handler) == ("signup", "other_users")
    assert created.acked
    assert deleted.acked
    assert (renamed.dead_lettered, renamed.reason, renamed.handler) == (
        True, Reason.NO_HANDLER, None,
    )  # fmt: skip
    assert "type 'UserRenamed'" in (renamed.error or "")
    assert ran == ["users u1", "users u1"]
