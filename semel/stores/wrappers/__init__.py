"""Stores that wrap another store and add one thing to it, whatever its backend
(:mod:`semel.stores.wrappers.deadline`: every call answers within a deadline)."""
