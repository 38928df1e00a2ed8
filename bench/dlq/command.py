"""One ``semel`` command run to its end, measured: wall time, its own CPU time and peak RSS,
and the most deliveries the broker counted unacknowledged on its channels."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.children import Child, Group

SEMEL = str(Path(sys.executable).with_name("semel"))
LIMIT = 1800.0  # seconds a command may run before it is killed
STOP_WAIT = 10.0  # seconds a command gets to go after SIGTERM, at the clean-up


@dataclass(slots=True)
class Outcome:
    """One command's run: what it printed, what it cost, what the broker saw."""

    code: int
    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    max_unacked: int | None  # None: no poll found its channels
    polls: int
    stdout: str
    stderr: str


class Watch(threading.Thread):
    """Polls the broker's unacked count on the command's channels; kills it past the limit."""

    def __init__(self, child: Child, every: float) -> None:
        super().__init__(daemon=True)
        self.child, self.every = child, every
        self.done = threading.Event()
        self.most: int | None = None
        self.polls = 0

    def run(self) -> None:
        deadline = time.monotonic() + LIMIT
        while not self.done.wait(self.every):
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.child.process.pid, signal.SIGKILL)
            try:
                held = Group([self.child]).unacked()
            except subprocess.CalledProcessError:
                continue
            if held is not None and not self.done.is_set():
                self.polls += 1
                self.most = max(self.most or 0, held)


def run_semel(args: list[str], env: dict[str, str], poll: float, live: set[int]) -> Outcome:
    """Run ``semel *args`` to its end (in a thread: it blocks), measured."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        # A session of its own: Ctrl-C reaches the bench, whose clean-up stops it.
        process = subprocess.Popen([SEMEL, *args], env=env, stdout=out, stderr=err,
                                   start_new_session=True)  # fmt: skip
        live.add(process.pid)
        watch = Watch(Child("semel", process, Path(os.devnull)), poll)
        watch.start()
        try:
            # wait4, not wait: the rusage of this child alone, its peak RSS included.
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            live.discard(process.pid)
            watch.done.set()
        wall = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        watch.join()
        out.seek(0)
        err.seek(0)
        return Outcome(
            process.returncode, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
            watch.most, watch.polls, out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
        )  # fmt: skip


async def stop(live: set[int]) -> None:
    """End the commands still running (``live``: their pids, until reaped): SIGTERM, then
    SIGKILL. Their own threads reap them, so this only waits for ``live`` to empty."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in list(live):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + STOP_WAIT
        while True:
            if not live:
                return
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
