"""Fault injection: worker kills, a broker restart and a store outage under duplicate traffic.

``python -m tests.chaos --help`` runs it; ``test_chaos.py`` is its reduced
version for the test suite.
"""
