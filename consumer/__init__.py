"""semel's consumer: run a handler effectively once per idempotency key.

The public API for handlers is this module's ``__all__``: the :class:`Context`
a handler is called with and :class:`PermanentError` to refuse a retry.
Transactional handlers import ``TransactionalContext`` from ``consumer.transactional``.
"""

from consumer.delivery.handler import Context
from consumer.errors import PermanentError

__all__ = ["Context", "PermanentError"]
