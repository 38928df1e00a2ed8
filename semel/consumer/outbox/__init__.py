"""The outbox any PostgreSQL transaction can write to, and the relay that publishes it."""
