"""One delivery from frame to settlement, with no broker or store of its own.

message (read the body, key and fingerprint) -> facts (what is known of a
delivery) -> decide (what to do, as a value) -> handler / lease (run the
user's code under a renewed claim) -> pipeline (the sequence). The broker
and the store come in as collaborators; this package imports neither aio-pika
channels nor a backend.
"""
