"""The ``semel`` command line: one module per command group, wired in ``app``."""
