"""The SQLite store: one database file on this host, the default backend.

Opened with :func:`open_store`; the store itself is in :mod:`semel.stores.sqlite.store`,
the statements in :mod:`semel.stores.sqlite.sql`, the error sorting in
:mod:`semel.stores.sqlite.errors`.
"""

from semel.stores.sqlite.store import SqliteStore, open_store

__all__ = ["SqliteStore", "open_store"]
