"""The DynamoDB store: one item per key, decided by conditional writes.

Importing this package imports boto3: it is imported only when selected.
"""

from semel.stores.dynamodb.store import DynamoDBStore, open_store

__all__ = ["DynamoDBStore", "open_store"]
