"""``python -m bench.outbox``: what the outbox costs a message on its way to the broker.

Two measurements in one run, on the local servers:

- latency: messages staged one transaction at a time at a steady rate, with
  the relay woken by ``LISTEN/NOTIFY`` and with its sweep alone; from the
  client's ``COMMIT`` to the relay's confirm and to the delivery downstream;
- throughput: rows staged beforehand, drained by one relay (and two), against
  the same messages published with :func:`publish_confirmed` from this process.

See docs/benchmarks.md ("The outbox").
"""
