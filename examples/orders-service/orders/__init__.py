"""An example service: two semel handlers in one worker."""
