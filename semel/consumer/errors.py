"""Every error the consumer raises, as one tree under :class:`semel.stores.errors.SemelError`.

Each class carries the process exit code it ends a command with: 2 for bad
usage or configuration (the operator's to fix), 1 for everything else (worth
a restart)::

    SemelError                  semel.stores.errors: the root, exit 1
     ├── StoreError ...          semel.stores.errors: unavailable, misconfigured,
     │                           too large, fenced out
     ├── ConfigurationError      exit 2: a setting, the handler, the topology, a command's options
     │    ├── HandlerLoadError   SEMEL_HANDLER names nothing callable
     │    ├── (a refused broker login is one too: the operator's to fix)
     │    ├── TopologyMismatch   a queue or exchange exists with other arguments
     │    └── PlanError          `semel publish` options that cannot be combined
     ├── BrokerUnavailable       the broker stayed away past the give-up limit
     ├── ListenError             SEMEL_METRICS_PORT cannot be listened on
     ├── BadMessage              a delivery that can never be processed: to the DLQ with a reason
     │    └── InvalidBody        the body does not validate as the handler's type
     ├── LeaseLost               the claim was taken over while the handler ran
     ├── HandlerTimeout          the handler ran past SEMEL_HANDLER_TIMEOUT: a failed attempt
     └── AlreadySettled          a second ack or nack of one delivery, never sent

    PermanentError              raised by a handler, not by semel: never retry
"""

from __future__ import annotations

from semel.consumer.names import Reason
from semel.stores.errors import EXIT_FAILURE, EXIT_USAGE, SemelError, StoreError

__all__ = [
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "AlreadySettled",
    "BadMessage",
    "BrokerUnavailable",
    "ConfigurationError",
    "HandlerLoadError",
    "HandlerTimeout",
    "InvalidBody",
    "LeaseLost",
    "ListenError",
    "PermanentError",
    "PlanError",
    "SemelError",
    "StoreError",
    "TopologyMismatch",
]


class PermanentError(Exception):
    """Raised by a handler: retrying cannot help; dead-letter the message now."""


class ConfigurationError(SemelError):
    """A setting, the handler or the broker's topology is wrong; one line names it."""

    exit_code = EXIT_USAGE


class HandlerLoadError(ConfigurationError):
    """``SEMEL_HANDLER`` does not name a callable that can be imported."""


class TopologyMismatch(ConfigurationError):
    """A queue or exchange exists with other arguments than semel declares."""


class PlanError(ConfigurationError):
    """``semel publish`` was given options that cannot be combined."""


class BrokerUnavailable(SemelError):
    """The broker could not be reached within the give-up limit."""


class ListenError(SemelError):
    """``SEMEL_METRICS_PORT`` cannot be listened on (in use, or not allowed)."""


class BadMessage(SemelError):
    """The delivery can never be processed; it goes to the DLQ with ``reason``."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class InvalidBody(BadMessage):
    """The body does not validate as the type the handler declares; ``errors`` is
    the bounded JSON list that goes into ``x-semel-validation-errors``."""

    def __init__(self, detail: str, errors: str) -> None:
        super().__init__(Reason.INVALID_BODY, detail)
        self.errors = errors


class LeaseLost(SemelError):
    """The claim was taken over while the handler ran; the new owner decides."""


class HandlerTimeout(SemelError):
    """The handler ran longer than ``SEMEL_HANDLER_TIMEOUT``; a failed attempt."""


class AlreadySettled(
    SemelError, RuntimeError
):  # RuntimeError: what aiormq raises on a closed channel too
    """A second ack or nack of one delivery; never sent, since the broker
    would close the channel and hand back every delivery in flight on it."""
