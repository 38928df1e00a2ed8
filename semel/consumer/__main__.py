"""``python -m semel`` runs the consumer, like ``semel consume``."""

from semel.consumer.commands.app import main

if __name__ == "__main__":
    import sys

    sys.argv[1:1] = ["consume"]
    main()
