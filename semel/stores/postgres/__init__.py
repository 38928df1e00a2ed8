"""The PostgreSQL stores: the plain one (:func:`open_store`) and the transactional
one (:mod:`semel.stores.postgres.transactional`, with its outbox in
:mod:`semel.stores.postgres.outbox`).

Importing this package imports psycopg: it is imported only when selected.
"""

from semel.stores.postgres.store import PostgresStore, open_store

__all__ = ["PostgresStore", "open_store"]
