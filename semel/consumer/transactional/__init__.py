"""Transactional mode (``SEMEL_TRANSACTIONAL=true``, PostgreSQL only): handlers
in the transaction that completes their key, and the outbox relay.

Importing this package needs psycopg (the ``postgres`` extra); the container
imports it only when this mode is selected.
"""

from semel.consumer.transactional.worker import TransactionalContext

__all__ = ["TransactionalContext"]
