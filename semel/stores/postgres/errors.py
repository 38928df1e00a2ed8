"""What the PostgreSQL server's failures become, sorted by SQLSTATE.

Both PostgreSQL stores send every statement of their own through
:func:`translated`, which turns the server's errors into the store errors of
:mod:`semel.stores.errors`:

=================================  =========================================
SQLSTATE                           becomes
=================================  =========================================
class 08 connection_exception      :class:`StoreUnavailable`
25006 read_only_sql_transaction    :class:`StoreUnavailable`: a standby, after a failover
40001 serialization_failure        :class:`StoreUnavailable`
40P01 deadlock_detected            :class:`StoreUnavailable`, once a batch statement
                                   has lost it ``DEADLOCK_ATTEMPTS`` times
                                   (``semel.stores.postgres.store``: sent again)
53000 insufficient_resources,      :class:`StoreUnavailable`
53100 disk_full, 53200 out_of_
memory, 53300 too_many_connections
55P03 lock_not_available           :class:`StoreUnavailable`: ``lock_timeout``, but
                                   the transactional store's claim answers
                                   "in progress" (``semel.stores.postgres.transactional``)
57014 query_canceled               :class:`StoreUnavailable`: ``statement_timeout``
57P01 admin_shutdown, 57P02        :class:`StoreUnavailable`
crash_shutdown, 57P03
cannot_connect_now
any other OperationalError;        :class:`StoreUnavailable`: libpq's and the pool's
InterfaceError; PoolTimeout        own failures carry no SQLSTATE
42501 insufficient_privilege       :class:`StoreMisconfigured`
42P01 undefined_table              :class:`StoreMisconfigured`
anything else                      raised as it is: a bug, or bad input
=================================  =========================================

Every transient SQLSTATE above is an ``OperationalError`` in psycopg but
25006, so :data:`UNAVAILABLE` names that one on its own. A failed connection
attempt carries no SQLSTATE at all (psycopg raises a bare
``OperationalError``): a refused login, a missing database and a role's
connection limit are all "unavailable" when the store opens. A handler's own
statements in a unit of work are not the store's: their errors are the
handler's (``TransactionalStore.run_unit``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from psycopg import errors

from semel.stores.errors import StoreError, StoreMisconfigured, StoreUnavailable

BACKEND = "postgres"

# The server cannot serve us now, and will again: the consumer waits for it.
UNAVAILABLE = (
    psycopg.OperationalError,  # classes 08, 40, 53, 55P03, 57; PoolTimeout is one too
    psycopg.InterfaceError,
    errors.ReadOnlySqlTransaction,
)

# Reachable, but not set up for semel: the operator's to fix.
MISCONFIGURED = (errors.InsufficientPrivilege, errors.UndefinedTable)


def one_line(exc: BaseException) -> str:
    """libpq's message on one line."""
    return " ".join(str(exc).split())


def store_error(exc: psycopg.Error) -> StoreError | None:
    """What ``exc`` becomes; ``None`` when it is no trouble of the server's."""
    if isinstance(exc, MISCONFIGURED):
        return StoreMisconfigured(
            f"{BACKEND} store not set up for semel ({exc.sqlstate}): {one_line(exc)}; "
            "run `semel migrate`, and grant the store's role its tables"
        )
    if isinstance(exc, UNAVAILABLE):
        return StoreUnavailable(BACKEND, one_line(exc))
    return None


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Raise the store error of any server failure inside, the failure as its cause."""
    try:
        yield
    except psycopg.Error as exc:
        error = store_error(exc)
        if error is None:
            raise
        raise error from exc
