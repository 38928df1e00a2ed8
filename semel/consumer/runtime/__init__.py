"""The running worker: the loop that consumes the work queue, the watch over the
store and the broker, and the background purge of what retention let go."""
