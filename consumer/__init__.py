"""semel's consumer: topology, delivery pipeline, routing, CLI and container."""

from consumer.errors import PermanentError

__all__ = ["PermanentError"]
