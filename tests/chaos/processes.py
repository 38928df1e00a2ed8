"""Process plumbing of a chaos run: cleanup at exit, service users, commands, children.

Everything a chaos run starts is registered with :func:`on_exit`, so the
``atexit`` hook stops it even when an exception or a signal skipped the
``finally`` blocks.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.servers import ROOT, wait_for_port

_cleanups: list[Callable[[], None]] = []


def on_exit(cleanup: Callable[[], None]) -> Callable[[], None]:
    """Run ``cleanup`` at interpreter exit unless it ran before; returns the once-only wrapper."""
    done = False

    def once() -> None:
        nonlocal done
        if not done:
            done = True
            with contextlib.suppress(Exception):
                cleanup()

    _cleanups.append(once)
    return once


def wait_gone(pid: int, limit: float) -> None:
    """Wait for ``pid`` to end, then make sure it has."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@atexit.register
def _clean_all() -> None:
    for cleanup in reversed(_cleanups):
        cleanup()


def private_dir(prefix: str, owner: str | None = None) -> Path:
    """A fresh temporary directory, handed to ``owner`` when we are root."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if owner and os.geteuid() == 0:
        shutil.chown(path, owner, owner)
    return path


def as_user(user: str, argv: list[str]) -> list[str]:
    return ["runuser", "-u", user, "--", *argv] if os.geteuid() == 0 else argv


async def run(argv: list[str], limit: float, env: dict[str, str] | None = None) -> str:
    """Run a command without blocking the event loop; raise with its output on failure."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), limit)
    except TimeoutError:
        # The whole group: rabbitmqctl runs its Erlang VM under su and sh.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise RuntimeError(f"{argv[0]} {argv[1:3]} timed out after {limit:g}s") from None
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {text[-2000:]}")
    return text


class Child:
    """A server run as our child process, in its own process group."""

    def __init__(self, argv: list[str], port: int, log: Path) -> None:
        self.argv, self.port, self.log = argv, port, log
        self.proc: subprocess.Popen[bytes] | None = None
        on_exit(self.kill)

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
            )
        wait_for_port(self.port, 60)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
