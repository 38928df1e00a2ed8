"""``python -m semel`` runs the consumer, like ``semel consume``; followed by a
command (``python -m semel migrate``), it is the ``semel`` command line itself."""

import sys

from semel.consumer.commands.app import app, main

if __name__ == "__main__":
    commands = {command.name for command in app.registered_commands}
    commands |= {group.name for group in app.registered_groups}
    first = sys.argv[1] if len(sys.argv) > 1 else ""
    if first not in commands and first not in ("--help", "--version"):
        sys.argv[1:1] = ["consume"]
    main()
