"""The outbox under faults: web requests staging messages while everything is killed.

``python -m tests.outbox_chaos --help`` runs it; ``test_outbox_chaos.py`` is
its reduced version for the test suite.
"""
