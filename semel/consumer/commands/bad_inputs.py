"""The bad inputs ``semel publish --bad`` sends, and what the consumer must make of each.

Each kind is one way a message can never be processed; :data:`EXPECTED_REASON`
is the ``x-semel-reason`` its dead letter must carry, the contract the
consumer's parser (:mod:`semel.consumer.delivery.message`) is checked against.
"""

from __future__ import annotations

from enum import StrEnum

from semel.consumer.names import Reason


class BadKind(StrEnum):
    """A bad input the consumer must dead-letter instead of running."""

    NOT_JSON = "not-json"
    INVALID_UTF8 = "invalid-utf8"
    EMPTY_BODY = "empty-body"
    JSON_ARRAY = "json-array"
    JSON_SCALAR = "json-scalar"
    TOO_LARGE = "too-large"
    MISSING_KEY = "missing-key"
    EMPTY_KEY = "empty-key"
    LONG_KEY = "long-key"
    NON_PRINTABLE_KEY = "non-printable-key"
    NON_STRING_KEY = "non-string-key"
    WRONG_CONTENT_TYPE = "wrong-content-type"
    KEY_REUSE = "key-reuse"


# The x-semel-reason each bad kind must end up with in the DLQ.
EXPECTED_REASON: dict[BadKind, Reason] = {
    BadKind.NOT_JSON: Reason.MALFORMED_BODY,
    BadKind.INVALID_UTF8: Reason.MALFORMED_BODY,
    BadKind.EMPTY_BODY: Reason.MALFORMED_BODY,
    BadKind.JSON_ARRAY: Reason.MALFORMED_BODY,
    BadKind.JSON_SCALAR: Reason.MALFORMED_BODY,
    BadKind.WRONG_CONTENT_TYPE: Reason.MALFORMED_BODY,
    BadKind.TOO_LARGE: Reason.TOO_LARGE,
    BadKind.MISSING_KEY: Reason.MISSING_KEY,
    BadKind.EMPTY_KEY: Reason.INVALID_KEY,
    BadKind.LONG_KEY: Reason.INVALID_KEY,
    BadKind.NON_PRINTABLE_KEY: Reason.INVALID_KEY,
    BadKind.NON_STRING_KEY: Reason.INVALID_KEY,
    BadKind.KEY_REUSE: Reason.PAYLOAD_MISMATCH,
}

# An AMQP message id is a short string that the client fills in when empty,
# so these kinds cannot be expressed when the key *is* the message id.
NOT_AS_MESSAGE_ID = {
    BadKind.MISSING_KEY,
    BadKind.EMPTY_KEY,
    BadKind.LONG_KEY,
    BadKind.NON_STRING_KEY,
}
# Bodies the consumer cannot parse: the key is still sent where it can be.
BROKEN_BODIES: dict[BadKind, bytes] = {
    BadKind.NOT_JSON: b'{"event": "order.paid", "order_id": ',
    BadKind.INVALID_UTF8: b'{"event": "order.paid", "note": "\xff\xfe"}',
    BadKind.EMPTY_BODY: b"",
    BadKind.JSON_SCALAR: b"42",
}
