"""Errors a handler raises to steer what happens to its message.

PermanentError   never retry: the key is marked failed, the message goes to the DLQ
(any other exception means "retry later", up to SEMEL_MAX_ATTEMPTS)
"""

from __future__ import annotations


class PermanentError(Exception):
    """Raised by a handler: retrying cannot help; dead-letter the message now."""
