"""semel against a three-node RabbitMQ cluster: node kills, a rolling restart, a partition.

``python -m tests.cluster --help`` runs the proofs and prints their figures;
``test_cluster.py`` runs them in the test suite. The cluster is
:mod:`tests.rabbit_cluster`; the ledger, workers, producer and verdict are
the chaos run's (:mod:`tests.chaos`).
"""
