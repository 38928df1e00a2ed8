"""semel's consumer: run a handler effectively once per idempotency key.

The public API for handlers is this module's ``__all__``: the :class:`App` that
declares several handlers, the :class:`Context` a handler is called with and
:class:`PermanentError` to refuse a retry.
Transactional handlers import ``TransactionalContext`` from ``semel.consumer.transactional``.
"""

from semel.consumer.app import App
from semel.consumer.delivery.handler import Context
from semel.consumer.errors import PermanentError

__all__ = ["App", "Context", "PermanentError"]
