"""The example service, as its own project would be used (issue #24, point 7).

``examples/orders-service`` is copied outside the checkout and installed with
semel's wheel into a venv of its own; its own tests run there (the testing
kit, no broker); then its Procfile runs under honcho against the real broker:
every key is handled once by each handler, duplicates ACKed unrun, and a body
that does not validate is dead-lettered with its reason.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from semel.consumer.names import H_REASON
from semel.settings import Settings, derived
from tests.consumer.harness import Broker, eventually
from tests.install.conftest import HandlerQueues
from tests.install.fresh import Venv, locked, run, session_folder, wheelhouse
from tests.install.honcho import honcho_start
from tests.servers import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXAMPLE = ROOT / "examples" / "orders-service"
HANDLERS = ("charge", "ship")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> tuple[Venv, Path]:
    """The example copied out of the checkout, and a venv with it and semel's wheel."""
    folder = session_folder(tmp_path_factory.getbasetemp())
    project = tmp_path_factory.mktemp("user") / "orders-service"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("*.db", "__pycache__"))
    venv = Venv(folder / "service-venv")
    with locked(folder / "service-venv.lock"):
        shutil.rmtree(venv.root, ignore_errors=True)
        run([sys.executable, "-m", "venv", "--without-pip", str(venv.root)])
        run(
            [
                *(sys.executable, "-m", "pip", "--python", venv.command("python")),
                *("install", "--quiet", "--no-compile"),
                # semel's dependencies from the wheelhouse; the example's test
                # tools from the index (pip's cache keeps them).
                *("--find-links", str(wheelhouse(wheel))),
                str(wheel),
                f"{project}[test]",
            ],
            timeout=420,
        )
    return venv, project


@pytest.fixture
def handler_queues() -> HandlerQueues:
    return {"charge": [1.0, 5.0, 30.0, 120.0], "ship": [2.0, 10.0]}  # as orders/app.py says


def test_the_services_own_tests_pass_in_its_own_venv(service: tuple[Venv, Path]) -> None:
    venv, project = service
    done = subprocess.run(
        [venv.command("python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        env=venv.environ(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


async def test_the_procfile_runs_both_handlers_each_key_once(
    service: tuple[Venv, Path], settings: Settings, broker: Broker
) -> None:
    venv, project = service
    env = venv.environ(
        SEMEL_AMQP_URL=settings.amqp_url,
        SEMEL_QUEUE=settings.queue,
        SEMEL_EXCHANGE=settings.exchange,
        SEMEL_METRICS_PORT="0",
    )

    charge, ship = (f"{settings.queue}.{name}" for name in HANDLERS)
    with honcho_start(project, env) as honcho:

        async def attached() -> bool:
            if honcho.exited() is not None:
                pytest.fail(f"honcho stopped before the worker consumed:\n{honcho.output()}")
            return all([await broker.consumers(q) > 0 for q in (charge, ship)])

        await eventually(attached, 60, "the worker consuming both queues")
        honcho.remember_groups()
        # The example's own script, as its README runs it.
        sent = await asyncio.to_thread(
            subprocess.run, ["sh", "send-traffic.sh"], cwd=project, env=env,
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        assert sent.stdout.count("published 7, confirmed 7") == 1, sent.stdout  # 5 keys, 2 copies

        async def drained() -> bool:
            output = honcho.output()
            done = output.count("charged order") >= 5 and output.count("shipped order") >= 3
            depths = [await broker.depth(q) for q in (charge, ship)]
            return done and not any(depths) and await broker.depth(f"{charge}.dlq") == 1

        await eventually(drained, 60, "every key handled and the bad body dead-lettered")
        letters = await broker.dead_letters(derived(settings, queue=charge))
        honcho.stop()

        async def stopped() -> bool:
            return honcho.exited() is not None

        await eventually(stopped, 30, "honcho stopped")
        output = honcho.output()

    assert "Traceback" not in output, output
    # 5 keys and 2 copies: each key charged once, the copies ACKed unrun.
    assert output.count("charged order o-1: 1250 EUR") == 5, output
    assert output.count("shipped order") == 3, output
    assert [letter.headers[H_REASON] for letter in letters] == ["invalid-body"]
    assert letters[0].key.startswith("charge:")
