"""What a worker process consumes: the queues, and the routes of each, planned from
the handler or app ``SEMEL_HANDLER`` (or ``semel consume TARGET``) names and the settings.

A single handler (``package.module:callable``) consumes ``SEMEL_QUEUE`` bound
with ``SEMEL_BINDING_KEYS``, as it always has. An :class:`~semel.consumer.app.App`
gets one queue per handler (or per ``queue=`` its handlers share), bound with
its handlers' patterns; each handler's settings are the process's with its own
options over them, checked as a whole (its retries must still fit in the
retention, say), and a bad one stops start-up naming the handler.

This module reads :class:`Settings`, like the container: it is part of the
composition root.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from semel.consumer.app import App, HandlerSpec
from semel.consumer.broker.topology import TopologySpec, queue_specs
from semel.consumer.delivery.decide import RetryPolicy
from semel.consumer.delivery.handler import load_target
from semel.consumer.delivery.message import KeySource, MessageRules
from semel.consumer.delivery.pipeline import PipelineConfig
from semel.consumer.delivery.routes import Route, Routes
from semel.consumer.delivery.typed import bind
from semel.consumer.errors import ConfigurationError, HandlerLoadError
from semel.consumer.runtime.purge import PURGE_INTERVAL
from semel.consumer.runtime.worker import WorkerConfig
from semel.settings import ConfigError, QueueType, Settings, derived

log = structlog.get_logger("semel.plan")


@dataclass(frozen=True, slots=True)
class QueuePlan:
    """One queue a worker consumes: its topology, its routes and the values it runs with."""

    topology: TopologySpec
    routes: Routes
    worker: WorkerConfig
    pipeline: PipelineConfig


def topology_of(settings: Settings) -> TopologySpec:
    """Every name and argument the broker's topology is declared with."""
    return TopologySpec(
        queue=settings.queue,
        exchange=settings.exchange,
        binding_keys=tuple(settings.binding_keys),
        quorum=settings.queue_type is QueueType.QUORUM,
        retry_delays=tuple(settings.retry_delays),
        conflict_delay=settings.conflict_delay,
    )


def message_rules(settings: Settings) -> MessageRules:
    return MessageRules(KeySource.parse(settings.key_source), settings.max_body_bytes)


def retry_policy(settings: Settings) -> RetryPolicy:
    return RetryPolicy(tuple(settings.retry_delays), settings.max_attempts)


def pipeline_config(settings: Settings) -> PipelineConfig:
    return PipelineConfig(
        queue=settings.queue,
        lock_ttl=settings.lock_ttl,
        in_flight=settings.prefetch,
        log_acks=settings.log_level.value == "debug",
    )


def purge_interval(settings: Settings) -> float:
    # Never longer than retention, or expired rows would outlast it.
    return min(PURGE_INTERVAL, settings.retention)


def worker_config(settings: Settings) -> WorkerConfig:
    return WorkerConfig(
        queue=settings.queue,
        prefetch=settings.prefetch,
        shutdown_grace=settings.shutdown_grace,
        broker_give_up=settings.broker_give_up,
        purge_interval=purge_interval(settings),
    )


def required_target(spec: str | None, app_dir: str) -> Any:
    """The handler or app ``SEMEL_HANDLER`` names: there is no default to fall back on."""
    if spec is None:
        raise HandlerLoadError(
            "SEMEL_HANDLER: not set; name the handler (package.module:callable) or the "
            "app (package.module:app) to run (the bundled example is "
            "semel.consumer.examples:order_paid)"
        )
    target = load_target(spec, app_dir)
    if not isinstance(target, App) and not callable(target):
        raise HandlerLoadError(f"SEMEL_HANDLER: {spec!r} is neither a callable nor a semel App")
    return target


def _plan(settings: Settings, routes: Routes) -> QueuePlan:
    """The queue ``settings`` name, consumed by ``routes``."""
    return QueuePlan(
        topology_of(settings), routes, worker_config(settings), pipeline_config(settings)
    )


def plans_for(target: Any, settings: Settings) -> list[QueuePlan]:
    """The queues ``target`` (a handler or an :class:`App`) is consumed from."""
    if not isinstance(target, App):
        # One handler taking every delivery; a typed body's annotations resolved here, once.
        handler = bind(target)
        return [
            _plan(
                settings,
                Routes.single(
                    handler, message_rules(settings), retry_policy(settings),
                    settings.handler_timeout,
                ),
            )
        ]  # fmt: skip
    if not target.handlers:
        raise HandlerLoadError("SEMEL_HANDLER: the app has no handlers (@app.handler(...))")
    if "binding_keys" in settings.model_fields_set:
        log.warning(
            "SEMEL_BINDING_KEYS is not used by an app: each handler's patterns are its bindings"
        )
    groups: dict[str, list[tuple[HandlerSpec, Settings]]] = {}
    for spec in target.handlers:
        queue = f"{settings.queue}.{spec.queue or spec.name}"
        groups.setdefault(queue, []).append((spec, handler_settings(spec, settings, queue)))
    return [_queue_plan(queue, members) for queue, members in groups.items()]


def handler_settings(spec: HandlerSpec, settings: Settings, queue: str) -> Settings:
    """The settings one handler runs under: the process's, with its own options."""
    changes: dict[str, object] = {"queue": queue}
    options = {
        "key_source": spec.key_source,
        "retry_delays": None if spec.retry_delays is None else list(spec.retry_delays),
        "max_attempts": spec.max_attempts,
        "handler_timeout": spec.time_limit,
        "prefetch": spec.prefetch,
    }
    changes |= {name: value for name, value in options.items() if value is not None}
    try:
        return derived(settings, **changes)
    except ConfigError as exc:
        raise ConfigurationError(f"handler {spec.name!r}: {exc}") from None


def _queue_plan(queue: str, members: list[tuple[HandlerSpec, Settings]]) -> QueuePlan:
    routes = Routes(
        [
            Route(
                spec.name,
                bind(spec.function),
                message_rules(own),
                retry_policy(own),
                own.handler_timeout,
                patterns=spec.patterns,
                message_type=spec.message_type,
                scope=f"{spec.name}:" if spec.key_scope is None else spec.key_scope,
            )
            for spec, own in members
        ]
    )
    first = members[0][1]
    # Handlers sharing a queue share its consumer: the largest prefetch one of
    # them asks for (else SEMEL_PREFETCH), every retry tier any of them uses, and
    # every pattern as a binding. Each value was checked with its handler's.
    asked = [spec.prefetch for spec, _ in members if spec.prefetch is not None]
    queue_settings = first.model_copy(
        update={
            "prefetch": max(asked) if asked else first.prefetch,
            "retry_delays": list(dict.fromkeys(d for _, own in members for d in own.retry_delays)),
            "binding_keys": list(dict.fromkeys(p for spec, _ in members for p in spec.patterns)),
        }
    )
    return _plan(queue_settings, routes)


def queue_names(plans: list[QueuePlan]) -> list[str]:
    """Every queue the plans declare, delay queues and DLQs included."""
    return [spec.name for plan in plans for spec in queue_specs(plan.topology)]
