"""``python -m bench.dlq``: the DLQ commands on 100,000 dead letters, run as an operator runs them.

.venv/bin/python -m bench.dlq                              # 100,000 letters
.venv/bin/python -m bench.dlq --letters 2000 --quick       # the smoke run: seconds

Seeds a private topology's ``Q.dlq`` with letters shaped like an incident's
(:mod:`bench.dlq.letters`), then runs each command as its own ``semel``
process with the topology's ``SEMEL_*`` environment: list, groups, a filtered
list as JSON, a replay's dry run and a paced replay of the burst to a private
queue. For each (:mod:`bench.dlq.command`): wall time, letters/s (every
command turns the whole DLQ), the process's CPU time and peak RSS (its own
rusage, from ``wait4``) and the most letters unacknowledged at once as the
broker saw them: ``rabbitmqctl list_channels`` summed over the command's
channels, polled every ``--poll`` s (``list_queues`` is no use here: a quorum
queue's own unacked count is refreshed only every few seconds). Each poll
costs rabbitmqctl about 0.4 s of CPU beside the command.

After each command the DLQ must hold what it should (its depth and the
output's counts; for the replay, every copy of the burst once, never faster
than the rate asked + 10 %): a failed check is shown in the table and makes
the exit code 1.
Everything it creates is deleted at the end, also on Ctrl-C or SIGTERM.
"""
