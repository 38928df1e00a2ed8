"""What SQLite's failures become, sorted by result code.

The SQLite store runs everything through :func:`semel.stores.sqlite.store.on_thread`,
which turns sqlite3's errors into the store errors of :mod:`semel.stores.errors`
by the error's primary result code (an extended code's low byte):

=================================  =======================================
result code                        becomes
=================================  =======================================
SQLITE_BUSY "database is locked"   :class:`StoreUnavailable`: another process held
                                   the write lock past the busy timeout
SQLITE_FULL "database or disk      :class:`StoreUnavailable`: space comes back
is full"
SQLITE_LOCKED, NOMEM, IOERR,       :class:`StoreUnavailable`, as they always were
CORRUPT, PROTOCOL, NOTADB
SQLITE_READONLY "attempt to        :class:`StoreMisconfigured`: a read-only file or
write a readonly database"         mount; but SQLITE_READONLY_RECOVERY, a WAL that
                                   another connection is about to recover, is
                                   :class:`StoreUnavailable`
SQLITE_CANTOPEN "unable to open    :class:`StoreMisconfigured` once the store is open
database file"                     (its directory gone or unwritable);
                                   :class:`StoreUnavailable` while it opens, as a
                                   volume may not be mounted yet
SQLITE_ERROR "no such table"       :class:`StoreMisconfigured`
anything else                      raised as it is: a bug (bad SQL, a constraint)
=================================  =======================================
"""

from __future__ import annotations

import sqlite3

from semel.stores.errors import StoreError, StoreMisconfigured, StoreUnavailable

BACKEND = "sqlite"

OUTAGE_CODES = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_PROTOCOL,
        sqlite3.SQLITE_NOTADB,
    }
)
MISCONFIGURED_CODES = frozenset({sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN})
PASSING_READONLY = frozenset({sqlite3.SQLITE_READONLY_RECOVERY})  # extended codes
MISSING_TABLE = "no such table"  # one SQLITE_ERROR among many that are bugs


def store_error(exc: sqlite3.Error, *, opening: bool = False) -> StoreError | None:
    """What ``exc`` becomes, ``opening`` while the store opens; ``None``: raise it as is."""
    code: int | None = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return None
    primary = code & 0xFF
    if code in PASSING_READONLY or (primary == sqlite3.SQLITE_CANTOPEN and opening):
        return StoreUnavailable(BACKEND, str(exc))
    if primary in MISCONFIGURED_CODES or (
        primary == sqlite3.SQLITE_ERROR and str(exc).startswith(MISSING_TABLE)
    ):
        return StoreMisconfigured(f"{BACKEND} store not set up for semel: {exc}")
    if primary in OUTAGE_CODES:
        return StoreUnavailable(BACKEND, str(exc))
    return None
