"""The producer's half: messages built and published the way semel's consumer reads them.

:class:`Publisher` (async) and :class:`SyncPublisher` (blocking, a loop in a
thread of its own) publish with the key placed by :func:`envelope`, confirmed,
and answer each message with a :class:`Receipt`. ``semel.Publisher`` adds
``open()``, which reads the settings (``semel.consumer.embedded.publishing``).
"""

from semel.consumer.producer.envelope import Envelope, envelope, stable_message_id
from semel.consumer.producer.publisher import PUBLISH_WINDOW, Publisher
from semel.consumer.producer.receipt import Answer, Message, Prepared, Receipt
from semel.consumer.producer.retry import NO_RETRY, RETRIED, Retry
from semel.consumer.producer.sync import SyncPublisher

__all__ = [
    "NO_RETRY",
    "PUBLISH_WINDOW",
    "RETRIED",
    "Answer",
    "Envelope",
    "Message",
    "Prepared",
    "Publisher",
    "Receipt",
    "Retry",
    "SyncPublisher",
    "envelope",
    "stable_message_id",
]
