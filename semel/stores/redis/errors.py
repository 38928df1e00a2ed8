"""What a Redis server's errors mean to semel: wait for it, stop and say, or refuse a key.

An error reply starts with its code, the first word (``OOM command not
allowed...``); one raised inside a script keeps it and gains a
``script: <sha>, on @user_script:<line>.`` tail. redis-py parses the codes
it knows into exception classes, so those are sorted by class, the rest by
their code:

- passes: lost connections and timeouts, a full server (``OOM``), failing
  snapshots (``MISCONF``), a replica (``READONLY``, ``MASTERDOWN``),
  ``LOADING``, a long script (``BUSY``), too few replicas (``NOREPLICAS``,
  or a ``WAIT`` not met: :class:`NotReplicated`, or cut short by a failover:
  ``UNBLOCKED``), a resharding or failing
  cluster (``TRYAGAIN``, ``CLUSTERDOWN``, and under ``redis+cluster://``
  ``MOVED`` / ``ASK`` still answered after the redirections the store
  follows): :class:`StoreUnavailable`, the consumer waits and loses nothing;
- the operator's to fix: credentials (``NOAUTH``, ``WRONGPASS``), an ACL
  (``NOPERM``), a Redis Cluster reached by a ``redis://`` URL (``MOVED``,
  ``ASK``, ``CROSSSLOT``), a command disabled or renamed (``unknown
  command``): :class:`StoreMisconfigured`;
- ``WRONGTYPE`` from a single-key script: a foreign value at that key,
  :class:`KeyRefused` (the batch scripts answer such a key themselves).

Anything else (an error in semel's own scripts, say) is not the server's
trouble and goes through as it came.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    ClusterCrossSlotError,
    ClusterDownError,
    InvalidResponse,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from semel.stores.errors import KeyRefused, StoreError, StoreMisconfigured, StoreUnavailable


class NotReplicated(RedisError):
    """Fewer replicas than asked acknowledged a write within the ``WAIT`` timeout.

    The write stands on the primary, which may lose it in a failover: the call
    counts as the store being away, never as a write that is safe. ``reply``
    is what the script answered, so granted claims can be given back.
    """

    def __init__(self, acked: int, wanted: int, timeout_ms: int, reply: Any = None) -> None:
        super().__init__(
            f"{acked} of {wanted} replicas acknowledged the write within {timeout_ms} ms"
        )
        self.reply = reply


# AuthenticationError is a ConnectionError, so these are looked at first.
# MovedError is an AskError.
_CREDENTIALS = (AuthenticationError, AuthenticationWrongNumberOfArgsError)
_CLUSTER = (AskError, ClusterCrossSlotError)
# BusyLoadingError (LOADING) is a ConnectionError, MasterDownError a ClusterDownError.
# A peer that does not speak RESP (a proxy, a TLS port reached in clear) fails
# as InvalidResponse: no store either until fixed.
_PASSING = (
    NotReplicated,
    RedisConnectionError,
    RedisTimeoutError,
    InvalidResponse,
    OSError,
    OutOfMemoryError,
    ReadOnlyError,
    TryAgainError,
    ClusterDownError,
)
_PASSING_CODES = frozenset(
    {"OOM", "MISCONF", "BUSY", "LOADING", "NOREPLICAS", "READONLY", "MASTERDOWN"}
    | {"TRYAGAIN", "CLUSTERDOWN"}  # a cluster resharding or failing over
    # A WAIT cut short by a failover (the primary became a replica): the write
    # may or may not have reached a replica, as with a lost connection.
    | {"UNBLOCKED"}
)
_CLUSTER_CODES = frozenset({"MOVED", "ASK", "CROSSSLOT"})
_REDIRECT_CODES = frozenset({"MOVED", "ASK"})
_CREDENTIALS_CODES = frozenset({"NOAUTH", "WRONGPASS"})
# Messages after the ERR code, which redis-py strips: a command the server
# lacks, sent by the client or called from a script; and an ACL refusing a
# command called from a script (the script's own call is refused as NOPERM).
_UNKNOWN_COMMAND = ("unknown command", "unknown redis command")
_DENIED_IN_SCRIPT = "the user executing the script can't"

CREDENTIALS = "the Redis server refused the URL's credentials"
NO_PERMISSION = (
    "the Redis user may not run what semel runs: EVALSHA, EVAL and PING, and inside "
    "its scripts TIME, EXISTS, TYPE, HMGET, HSET, HDEL, PEXPIRE and PTTL on its key prefix"
)
CLUSTER = (
    "a Redis Cluster node answered a redis:// URL; reach a cluster with "
    "redis+cluster://host:port[,host:port...]"
)
UNKNOWN_COMMAND = "the Redis server lacks a command semel needs (disabled or renamed)"


def foreign(kind: str = "value of another type") -> str:
    """Why a key is refused: a Redis ``kind`` (string, list...) holds it, not semel's hash."""
    return f"a Redis {kind} holds the key, not semel's hash"


def error_code(exc: ResponseError) -> str:
    """The reply's code: its first word, moved to ``status_code`` for codes redis-py knows."""
    code: str | None = getattr(exc, "status_code", None)  # redis-py 6 and later
    return code or str(exc).partition(" ")[0]


def misconfiguration(exc: BaseException, cluster: bool = False) -> str | None:
    """What the operator must fix when ``exc`` says the server is not set up for semel.

    With ``cluster`` the store speaks Redis Cluster: a redirection is a slot
    on the move, and a script spanning slots a bug of semel's, raised as is.
    """
    if isinstance(exc, _CREDENTIALS):
        return CREDENTIALS
    if isinstance(exc, _CLUSTER):
        return None if cluster else CLUSTER
    if isinstance(exc, NoPermissionError):
        return NO_PERMISSION
    if not isinstance(exc, ResponseError):
        return None
    code = error_code(exc)
    if code in _CREDENTIALS_CODES:
        return CREDENTIALS
    if code in _CLUSTER_CODES:
        return None if cluster else CLUSTER
    message = str(exc).lower()
    if code == "NOPERM" or message.startswith(_DENIED_IN_SCRIPT):
        return NO_PERMISSION
    if message.startswith(_UNKNOWN_COMMAND):
        return UNKNOWN_COMMAND
    return None


def passes(exc: BaseException, cluster: bool = False) -> bool:
    """Whether ``exc`` is a condition that passes: the server is down, full, busy or moving."""
    if isinstance(exc, _PASSING) or (cluster and isinstance(exc, AskError)):
        return True
    if not isinstance(exc, ResponseError):
        return False
    code = error_code(exc)
    return code in _PASSING_CODES or (cluster and code in _REDIRECT_CODES)


def store_error(
    backend: str, exc: RedisError | OSError, key: str | None, cluster: bool = False
) -> StoreError | None:
    """The store error ``exc`` stands for; ``None`` for none of the server's known refusals.

    ``key`` is the one key of a single-key script, which ``WRONGTYPE`` refuses;
    ``cluster`` as in :func:`misconfiguration`.
    """
    described = f"{type(exc).__name__}: {exc}"
    fix = misconfiguration(exc, cluster)
    if fix is not None:
        return StoreMisconfigured(f"{fix}: {described}")
    if passes(exc, cluster):
        return StoreUnavailable(backend, described)
    if key is not None and isinstance(exc, ResponseError) and error_code(exc) == "WRONGTYPE":
        return KeyRefused(key, foreign())
    return None
