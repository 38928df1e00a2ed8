"""The Redis store: one server, a Sentinel-managed primary or a Cluster, picked by
the URL (:mod:`semel.stores.redis.url`); the contract itself is in Lua scripts
(``scripts/``, loaded by :mod:`semel.stores.redis.base`).

Importing this package imports redis-py: it is imported only when selected. Every
import of redis-py in it is absolute, so ``import redis`` reaches the client
library, never this package.
"""

from semel.stores.redis.store import open_store

__all__ = ["open_store"]
