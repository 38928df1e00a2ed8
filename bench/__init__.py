"""semel's benchmark: throughput, latency and memory against a bare aio-pika consumer.

Run it with ``python -m bench``; bench/README.md says what each figure means
and how it is measured.
"""
