"""semel: run a RabbitMQ handler effectively once per idempotency key.

The packages live under this one name so that a service's own top-level
``settings``, ``stores`` or ``consumer`` never shadows them, nor they it:
``semel.consumer`` (handlers import ``Context`` and ``PermanentError`` from it),
``semel.stores`` and ``semel.settings``.
"""
