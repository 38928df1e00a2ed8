"""The publisher's retry rule: which answers are sent again, how often, after what pause.

Retried: *nacked* (the broker refused it now; a full queue may drain),
*timed_out* and *failed* (no answer: the message may or may not be queued).
Never retried: *confirmed*, and *returned* (no queue is bound for the routing
key; seconds later the bindings are the same, so it is the caller's to fix).
A retry is the same message: the same message id, key, body and headers, so
a consumer downstream drops a copy that did arrive.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from semel.consumer import backoff
from semel.consumer.producer.receipt import Answer

RETRIED = frozenset({Answer.NACKED, Answer.TIMED_OUT, Answer.FAILED})


@dataclass(frozen=True, slots=True)
class Retry:
    """At most ``attempts`` publishes of one message in all; pauses double from
    ``first`` up to ``longest`` seconds, each drawn from the upper half of its
    ceiling (semel's one back-off)."""

    attempts: int = 3
    first: float = 0.5
    longest: float = 5.0
    draw: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.first < 0 or self.longest < self.first:
            raise ValueError("Retry needs attempts >= 1 and 0 <= first <= longest")

    def again(self, answer: Answer, attempts: int) -> bool:
        """Whether a message answered ``answer`` after ``attempts`` publishes is sent again."""
        return answer in RETRIED and attempts < self.attempts

    def pause(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th publish before the next."""
        return backoff.pause(attempts - 1, self.first, self.longest, self.draw())


NO_RETRY = Retry(attempts=1)
