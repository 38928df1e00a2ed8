"""The docs cannot drift from the code: the configuration and CLI pages are what
``docs/generate.py`` writes now, every Python sample in the docs is included from
``examples/`` (and every one in the README is found there verbatim), and the
examples run."""

from __future__ import annotations

import re
import runpy
import uuid
from pathlib import Path

import aio_pika
import pytest
from aio_pika.exceptions import DeliveryError

from examples import store_api
from examples.handlers import charge, psp
from examples.producer import publish_order_paid
from examples.testing_handlers import test_charge as testing_example
from semel.consumer.testing import HandlerKit
from semel.settings.described import DEFAULT_NOTES, MEANINGS
from semel.settings.model import Settings

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
SNIPPET = re.compile(r'^--8<-- "([^":]+)(?::([\w-]+))?"$')
README_LINES = 250


def generator() -> dict[str, object]:
    return runpy.run_path(str(DOCS / "generate.py"))


@pytest.mark.parametrize("page", ["configuration.md", "cli.md"])
def test_a_generated_page_is_what_the_code_says_now(page: str) -> None:
    make = generator()["PAGES"][page]  # type: ignore[index]
    assert (DOCS / page).read_text() == make(), f"docs/{page} is stale: python docs/generate.py"


def test_every_setting_has_a_meaning_and_every_meaning_a_setting() -> None:
    fields = set(Settings.model_fields)
    assert set(MEANINGS) == fields
    assert set(DEFAULT_NOTES) <= fields


def test_every_python_sample_in_the_docs_is_included_from_an_example() -> None:
    pages = sorted(DOCS.glob("*.md"))
    assert pages
    for page in pages:
        for block in PYTHON_BLOCK.findall(page.read_text()):
            lines = [line for line in block.splitlines() if line.strip()]
            assert lines, page.name
            for line in lines:
                match = SNIPPET.match(line)
                assert match, f"{page.name}: a Python sample not included from examples/: {line}"
                source = ROOT / match.group(1)
                assert source.is_file(), line
                assert source.is_relative_to(ROOT / "examples"), line
                if match.group(2):
                    assert f"[start:{match.group(2)}]" in source.read_text(), line


def test_the_readme_is_a_front_page_whose_samples_are_examples() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < README_LINES
    examples = [p.read_text() for p in (ROOT / "examples").rglob("*.py")]
    samples = PYTHON_BLOCK.findall(readme)
    assert samples
    for sample in samples:
        assert any(sample in text for text in examples), f"not in examples/:\n{sample}"


async def test_the_testing_example_passes() -> None:
    await testing_example()


async def test_the_handler_example_charges_once_per_key() -> None:
    async with HandlerKit(charge) as kit:
        first = await kit.send({"amount": 5}, key="k-1")
        again = await kit.send({"amount": 5}, key="k-1")
        refused = await kit.send({}, key="k-2")
    assert first.stored == {"payment_id": psp.charges["k-1"].id}
    assert again.duplicate
    assert refused.dead_lettered
    assert refused.reason == "permanent-error"


async def test_the_store_api_example_charges_once_per_key(redis_server: str) -> None:
    before = len(store_api.charges)
    first, again = await store_api.main(redis_server, "t" + uuid.uuid4().hex[:12])
    assert len(store_api.charges) == before + 1
    assert first == again == {"charge": len(store_api.charges)}


async def test_the_producer_example_publishes_what_semel_reads(rabbitmq_server: str) -> None:
    connection = await aio_pika.connect(rabbitmq_server)
    name = f"t.{uuid.uuid4().hex[:8]}.events"
    try:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC)
        queue = await channel.declare_queue(exclusive=True)
        await queue.bind(exchange, "orders.paid")
        await publish_order_paid(rabbitmq_server, "o-7", 1250, name)
        message = await queue.get(no_ack=True, timeout=5)
        assert message.headers["Idempotency-Key"] == "order-paid-o-7"
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert message.body == b'{"order_id": "o-7", "amount": 1250}'
        await queue.unbind(exchange, "orders.paid")
        with pytest.raises(DeliveryError):  # nobody bound: returned, not lost silently
            await publish_order_paid(rabbitmq_server, "o-8", 1, name)
        await exchange.delete()
    finally:
        await connection.close()
