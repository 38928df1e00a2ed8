#!/bin/sh
# Test traffic for the worker that `honcho start` runs: five payments (two of
# them sent twice), three shipments, one payment without an amount; then the
# charge handler's dead letters. --no-declare: the worker declared its queues.
set -e
semel publish --no-declare --routing-key orders.paid --count 5 --duplicates 0.4 \
    --body '{"order_id": "o-1", "amount": 1250}'
semel publish --no-declare --routing-key orders.eu.packed --count 3 \
    --body '{"address": "1 Quay St"}'
semel publish --no-declare --routing-key orders.paid --body '{"order_id": "o-9"}'
sleep 1  # the worker settles them meanwhile
SEMEL_QUEUE="${SEMEL_QUEUE:-semel.work}.charge" semel dlq list
