"""``python -m semel`` runs the consumer: ``python -m semel.consumer``, ``semel consume``."""

import runpy

if __name__ == "__main__":
    runpy.run_module("semel.consumer", run_name="__main__")
