"""Operations: metrics, the metered store, health and the HTTP endpoint,
logs and tracing. Observers only: nothing here changes what happens to a message."""
