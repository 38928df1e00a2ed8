"""Everything that talks AMQP: the connection, the topology, the work queue's
consumer, settling deliveries, confirmed publishes and the dead-letter queue."""
