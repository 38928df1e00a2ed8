"""``honcho start`` of a project's Procfile, as a process the test can always clean up.

honcho starts each Procfile line in a session of its own (its shell and what
the shell runs), so killing honcho's process group would leave the worker
running. The groups of honcho and of every process under it are remembered
while they run and all killed when the test ends, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil


class Honcho:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log
        self.groups = {proc.pid}  # started in a session of its own: its group is its pid

    def remember_groups(self) -> None:
        """Note the process group of everything under honcho now."""
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                with contextlib.suppress(ProcessLookupError):
                    self.groups.add(os.getpgid(child.pid))

    def exited(self) -> int | None:
        return self.proc.poll()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM to honcho alone: it hands the signal on to every process it started."""
        self.remember_groups()
        self.proc.send_signal(signal.SIGTERM)

    def kill_all(self) -> None:
        self.remember_groups()
        for group in self.groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        self.proc.wait()


@contextlib.contextmanager
def honcho_start(project: Path, env: dict[str, str]) -> Iterator[Honcho]:
    """Run ``honcho start`` in ``project``; every process it started is killed at the end."""
    log = project.parent / "honcho.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "honcho", "start"],
            cwd=project,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    started = Honcho(proc, log)
    try:
        yield started
    finally:
        started.kill_all()
