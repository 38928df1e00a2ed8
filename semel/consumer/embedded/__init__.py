"""semel inside a consumer of the application's own: the engine (:class:`Semel`) and
its front doors, the aio-pika scope (``semel.process``) and the FastStream
middleware (``semel.faststream()``), on the worker's own pipeline."""

from semel.consumer.delivery.handler import Context
from semel.consumer.embedded.door import current_passage
from semel.consumer.embedded.engine import Semel


def current() -> Context | None:
    """The key, fence and attempt of the delivery this task's handler runs for
    (inside the FastStream middleware); ``None`` outside one."""
    passage = current_passage()
    return None if passage is None else passage.context


__all__ = ["Context", "Semel", "current"]
