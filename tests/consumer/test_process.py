"""``python -m semel`` as a real process: crashes, restarts, signals, start-up errors."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from semel.consumer import Context
from semel.consumer.broker.topology import queue_specs
from semel.consumer.delivery.message import fingerprint
from semel.consumer.names import Topology
from semel.consumer.ops.collector import FIRST_GENERATION_THRESHOLD
from semel.consumer.plan import topology_of
from semel.settings import LogFormat, LogLevel, Settings
from semel.stores.base import Outcome, Status, Store
from tests.conftest import settings_env
from tests.consumer.conftest import CONSUMER_BACKENDS, KEPT_LEASE, ConsumerSettings
from tests.consumer.handlers import ALLOW_DIE_ENV, LEDGER_ENV, read_ledger, record
from tests.consumer.harness import Broker, ConsumerProcess, eventually, processes
from tests.consumer.test_delivery import only_dead_letters, runs, settle_all, status_is
from tests.consumer.test_faults import all_completed
from tests.servers import ROOT, free_port

pytestmark = pytest.mark.timeout(90)


def consumer_process(settings: Settings, ledger: Path, **env: str) -> ConsumerProcess:
    return ConsumerProcess(settings, ledger.with_suffix(".log"), **{LEDGER_ENV: str(ledger)}, **env)


@pytest.mark.parametrize("backend", CONSUMER_BACKENDS)
async def test_a_message_that_kills_its_worker_every_time_ends_as_poison(
    consumer_settings: ConsumerSettings, broker: Broker, store: Store, ledger: Path
) -> None:
    settings = consumer_settings(max_claims=3, lock_ttl=1.0)
    dlq = Topology(settings.queue).dead_letter_queue
    await broker.declare(settings)
    await broker.publish(settings, {"die": True}, key="killer")
    deaths = 0
    with processes() as started:
        # A supervisor's loop: restart the worker whenever it dies.
        while await broker.depth(dlq) == 0:
            assert deaths <= settings.max_claims, "poison never detected"
            worker = consumer_process(settings, ledger, **{ALLOW_DIE_ENV: "1"}).start()
            started.append(worker)

            async def exited_or_dead_lettered(worker: ConsumerProcess = worker) -> bool:
                return worker.exited() is not None or await broker.depth(dlq) > 0

            await eventually(exited_or_dead_lettered, 30, "a death or the dead letter")
            if worker.exited() is not None:
                assert worker.exited() == 3, worker.output()  # killed by its handler
                deaths += 1
        # A worker that dies just after a delay queue's hop back to Q (its ACK
        # not yet on the wire) leaves the message in both: a second copy, which
        # the store answers. A poison key's copy is dead-lettered again.
        await settle_all(broker, settings, dead_letters=None)
        survivor = started[-1]
        survivor.signal(signal.SIGTERM)
        assert await survivor.wait() == 0, survivor.output()

    assert deaths == settings.max_claims
    fences = [e["fence"] for e in runs(ledger, "killer")]
    assert fences == [fences[0], fences[0] + 1, fences[0] + 2]  # each death, a takeover
    assert await status_is(store, "killer", Status.FAILED)
    letters = await broker.dead_letters(settings)
    assert {(letter.reason, letter.key) for letter in letters} == {("poison", "killer")}
    assert await only_dead_letters(broker, settings, 0)


@pytest.mark.parametrize("backend", CONSUMER_BACKENDS)
async def test_a_restart_in_the_middle_of_a_stream_loses_nothing(
    consumer_settings: ConsumerSettings, broker: Broker, store: Store, ledger: Path
) -> None:
    settings = consumer_settings(lock_ttl=1.0, prefetch=4)
    await broker.declare(settings)
    keys = [f"order-{i}" for i in range(40)]
    for key in keys:
        await broker.publish(settings, {"sleep": 0.1, "key": key}, key=key)
    for key in keys[::4]:  # duplicates, published while the first copies are queued
        await broker.publish(settings, {"sleep": 0.1, "key": key}, key=key)

    with processes() as started:
        first = consumer_process(settings, ledger).start()
        started.append(first)

        async def some_done() -> bool:
            return len([e for e in read_ledger(ledger) if e["event"] == "end"]) >= 8

        await eventually(some_done, 30, "the first worker under way")
        first.kill()  # SIGKILL: no chance to release or to acknowledge
        second = consumer_process(settings, ledger).start()
        started.append(second)
        await eventually(lambda: all_completed(store, keys), 40, "every key completed")
        await settle_all(broker, settings, dead_letters=0)
        second.signal(signal.SIGTERM)
        assert await second.wait() == 0, second.output()

    assert await only_dead_letters(broker, settings, 0)  # nothing handed back unsettled
    starts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in read_ledger(ledger):
        if event["event"] == "start":
            starts[event["key"]].append(event)
    assert set(starts) == set(keys)
    for key, runs_of_key in starts.items():
        # A second run is explained only by the killed worker: it died before
        # its completion reached the store.
        earlier = runs_of_key[:-1]
        assert all(run["pid"] == first.pid for run in earlier), (key, runs_of_key)
        # The completion on record is the last run's (a claim the killed worker
        # made just before dying may have no run at all).
        record = await store.get(key)
        assert record is not None
        assert record.fence == runs_of_key[-1]["fence"], (key, runs_of_key)


@pytest.mark.parametrize("backend", CONSUMER_BACKENDS)
async def test_sigterm_lets_short_work_finish_and_holds_the_keys_of_threads_still_running(
    consumer_settings: ConsumerSettings, broker: Broker, store: Store, ledger: Path
) -> None:
    # A plain (thread) handler, which cannot be cancelled; a long lease, so only
    # a release could free a key before the process is long gone.
    settings = consumer_settings(
        handler="tests.consumer.handlers:blocking", shutdown_grace=1.0, lock_ttl=30.0
    )
    await broker.declare(settings)
    await broker.publish(settings, {"sleep": 0.5}, key="short")
    # Past the grace, within the wait for threads at the cut short: recorded as usual.
    await broker.publish(settings, {"sleep": 3}, key="late")
    await broker.publish(settings, {"sleep": 60}, key="stuck")
    with processes() as started:
        worker = consumer_process(settings, ledger).start()
        started.append(worker)

        async def all_running() -> bool:
            return {e["key"] for e in read_ledger(ledger)} == {"short", "late", "stuck"}

        await eventually(all_running, 20, "the three handlers running")
        worker.signal(signal.SIGTERM)
        assert await worker.wait(20) == 0, worker.output()

    assert await status_is(store, "short", Status.COMPLETED)
    assert await status_is(store, "late", Status.COMPLETED), worker.output()
    # Its thread still ran when the process exited: the key was never released,
    # so no other worker could run it beside that thread; its lease runs out.
    again = await store.claim("stuck", fingerprint({"sleep": 60}))
    assert again.outcome is Outcome.IN_PROGRESS, again
    assert "handler thread still running" in worker.output()

    # Handed back, not lost. A quorum queue applies a return through its log,
    # so the count it reports may lag the worker's exit.
    async def handed_back() -> bool:
        return await broker.depth(settings.queue) == 1

    await eventually(handed_back, 10, f"'stuck' back in the queue; worker: {worker.output()}")
    depths = await broker.depths(settings)
    assert sum(depths.values()) == 1, depths  # in no other queue besides
    queue = await broker.channel.declare_queue(settings.queue, passive=True)
    message = await queue.get(no_ack=True, timeout=5)
    # Straight back, not through the conflict queue (which would add x-death).
    assert message.headers.get("Idempotency-Key") == "stuck"
    assert "x-death" not in message.headers


RELEASE_ENV = "SEMEL_TEST_RELEASE"  # a file: once it exists, `held_until_released` returns


def held_until_released(context: Context) -> Any:
    """A plain handler whose thread blocks until the test creates the file named by
    ``SEMEL_TEST_RELEASE`` (a minute at most): it outlives any grace on demand."""
    record(context, "start")
    release = Path(os.environ[RELEASE_ENV])
    end = time.monotonic() + 60
    while not release.exists() and time.monotonic() < end:
        time.sleep(0.05)
    record(context, "end")
    return {"released": release.exists()}


@pytest.mark.parametrize("backend", ["postgres", "redis"])
async def test_a_rolling_restart_never_runs_a_thread_handler_beside_itself(
    consumer_settings: ConsumerSettings, broker: Broker, store: Store, ledger: Path
) -> None:
    """Worker A is stopped while its thread runs past the shutdown grace; worker B
    on the same queue gets the message back at once, but runs the key only after
    A's thread has ended or A's process (and the thread with it) has gone."""
    settings = consumer_settings(
        handler="tests.consumer.test_process:held_until_released",
        shutdown_grace=1.0,
        lock_ttl=KEPT_LEASE,
        handler_timeout=70.0,
    )
    release = ledger.with_suffix(".release")
    await broker.declare(settings)
    await broker.publish(settings, {}, key="long")
    with processes() as started:
        first = consumer_process(settings, ledger, **{RELEASE_ENV: str(release)}).start()
        started.append(first)

        def runs_by(pid: int) -> list[dict[str, Any]]:
            return [e for e in read_ledger(ledger) if e["key"] == "long" and e["pid"] == pid]

        async def first_running() -> bool:
            return bool(runs_by(first.pid))

        await eventually(first_running, 20, "A running 'long'")
        second = consumer_process(settings, ledger, **{RELEASE_ENV: str(release)}).start()
        started.append(second)
        await eventually(lambda: _consumers(broker, settings.queue, 2), 20, "B attached")
        # A's thread blocks past the grace and the wait a stop gives threads.
        first.signal(signal.SIGTERM)
        # Polled: the exit seen here is no earlier than the real one.
        assert await first.wait(30) == 0, first.output()
        first_gone = time.time()
        release.touch()  # from now on, a run of 'long' ends at once

        async def second_ran() -> bool:
            return any(e["event"] == "end" for e in runs_by(second.pid))

        await eventually(second_ran, 30, f"B ran 'long'; B: {second.output()}")
        second.signal(signal.SIGTERM)
        assert await second.wait() == 0, second.output()

    a_runs, b_runs = runs_by(first.pid), runs_by(second.pid)
    a_end = [e["t"] for e in a_runs if e["event"] == "end"]
    b_start = min(e["t"] for e in b_runs if e["event"] == "start")
    a_over = min([*a_end, first_gone])
    assert b_start >= a_over, (
        f"B started 'long' {a_over - b_start:.2f}s before A's thread ended or A exited: "
        f"{a_runs + b_runs}"
    )
    assert max(e["fence"] for e in b_runs) > max(e["fence"] for e in a_runs)
    assert await status_is(store, "long", Status.COMPLETED)


async def _consumers(broker: Broker, queue: str, count: int) -> bool:
    return await broker.consumers(queue) >= count


def run_consumer(settings: Settings, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "semel"],
        env=settings_env(settings) | env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("queue_suffix", "argument", "value"),
    [
        ("", "x-queue-type", "classic"),
        ("", "x-dead-letter-routing-key", "elsewhere"),
        (".retry.conflict", "x-message-ttl", 60000),
    ],
)
async def test_a_queue_declared_differently_stops_start_up_with_exit_2(
    settings: Settings, broker: Broker, queue_suffix: str, argument: str, value: Any
) -> None:
    (spec,) = [
        s for s in queue_specs(topology_of(settings)) if s.name == settings.queue + queue_suffix
    ]
    arguments = spec.arguments | {argument: value}
    if value == "classic":  # quorum-only arguments would be refused for a classic queue
        arguments = {"x-queue-type": "classic"}
    channel = await broker.connection.channel()
    await channel.declare_queue(spec.name, durable=True, arguments=arguments)
    await channel.close()

    proc = await asyncio.to_thread(run_consumer, settings)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"semel: error: queue {spec.name!r}: ")
    assert f"'{argument}'" in line or value == "classic", line


@pytest.mark.parametrize(
    ("env", "code", "message"),
    [
        ({"SEMEL_HANDLER": "tests.consumer.handlers:absent"}, 2, "SEMEL_HANDLER"),
        ({"SEMEL_HANDLER": "tests.consumer.handlers:not_callable"}, 2, "neither a callable"),
        ({"SEMEL_PREFETCH": "0"}, 2, "SEMEL_PREFETCH"),
        ({"SEMEL_AMQP_URL": "amqp://guest:s3cret@127.0.0.1:{port}/",
          "SEMEL_BROKER_GIVE_UP": "1"}, 1, "broker unreachable"),
    ],
)  # fmt: skip
async def test_start_up_errors_are_one_line_with_their_exit_code(
    settings: Settings, env: dict[str, str], code: int, message: str
) -> None:
    env = {name: value.format(port=free_port()) for name, value in env.items()}
    proc = await asyncio.to_thread(run_consumer, settings, **env)
    assert proc.returncode == code, proc.stderr
    # One error line, last; a broker being waited for is logged on the way.
    *waiting, line = proc.stderr.strip().splitlines()
    assert line.startswith("semel: error: ")
    assert message in line
    assert all("retrying" in w for w in waiting), waiting
    assert "Traceback" not in proc.stderr
    assert "s3cret" not in proc.stderr


async def test_the_bundled_example_handler_runs_from_the_environment_alone(
    settings: Settings, broker: Broker, store: Store, tmp_path: Path
) -> None:
    """The bundled example handler with nothing but the environment, like the Procfile."""
    default = settings.model_copy(
        update={
            "handler": "semel.consumer.examples:order_paid",
            "log_format": LogFormat.JSON,
            "log_level": LogLevel.DEBUG,
        }
    )
    await broker.declare(default)
    await broker.publish(default, {"order_id": "A-1", "amount": 42}, key="paid-1")
    await broker.publish(default, {"amount": 1}, key="paid-2")  # no order id: permanent
    with processes() as started:
        worker = ConsumerProcess(default, tmp_path / "worker.log").start()
        started.append(worker)
        await eventually(lambda: status_is(store, "paid-1", Status.COMPLETED), 20, "completed")
        await settle_all(broker, default, dead_letters=1)
        worker.signal(signal.SIGINT)
        assert await worker.wait() == 0, worker.output()
    record = await store.get("paid-1")
    assert record is not None
    assert record.result == {
        "order_id": "A-1", "amount": 42, "currency": "EUR", "status": "recorded"
    }  # fmt: skip
    (letter,) = await broker.dead_letters(default)
    assert letter.reason == "permanent-error"
    assert "order_id" in letter.headers["x-semel-error"]
    # One JSON line per settle decision, and never a body in it.
    lines = [json.loads(line) for line in worker.output().splitlines() if line.startswith("{")]
    settled = {line["key"]: line for line in lines if line["event"] == "settled"}
    assert settled.keys() == {"paid-1", "paid-2"}
    assert settled["paid-1"]["outcome"] == "completed"
    assert settled["paid-2"]["reason"] == "permanent-error"
    for line in settled.values():
        assert {"fence", "attempt", "duration_ms", "level", "timestamp"} <= line.keys()
    assert (settled["paid-1"]["level"], settled["paid-2"]["level"]) == ("debug", "info")
    assert "A-1" not in worker.output()


async def test_the_worker_sets_its_garbage_collector_once_started(
    settings: Settings, broker: Broker, store: Store, tmp_path: Path
) -> None:
    """``semel consume`` freezes what start-up built and collects the young generation
    less often: hundreds of deliveries in flight no longer make the collector
    walk them every 700 allocations (see semel.consumer.ops.collector)."""
    worker_settings = settings.model_copy(update={"handler": "tests.consumer.handlers:collector"})
    await broker.declare(worker_settings)
    await broker.publish(worker_settings, {"n": 1}, key="gc-1")
    with processes() as started:
        worker = ConsumerProcess(worker_settings, tmp_path / "worker.log").start()
        started.append(worker)
        await eventually(lambda: status_is(store, "gc-1", Status.COMPLETED), 20, "completed")
        worker.signal(signal.SIGTERM)
        assert await worker.wait() == 0, worker.output()
    record = await store.get("gc-1")
    assert record is not None
    threshold, frozen = record.result["threshold"], record.result["frozen"]
    assert threshold == [FIRST_GENERATION_THRESHOLD, *gc.get_threshold()[1:]]
    # The modules, the container, the connections and the handler: frozen.
    assert frozen > 10_000
