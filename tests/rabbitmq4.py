"""RabbitMQ 4 beside the machine's own broker: Debian 13's package in a debootstrap root.

The machine's RabbitMQ is Debian 12's 3.10. Debian 13 carries 4.0 (with
Erlang 27) as an ordinary package, so the tests build a minimal Debian 13
root holding it, once per machine, in a cache outside the checkout, and run
nodes from it with ``chroot``. A node in the root is an ordinary Erlang node
on loopback: it shares the host's network and ``epmd``, and has its own node
name, ports and data directory, so it never touches the 3.10 node.

``python -m tests.rabbitmq4`` builds the root and starts the shared test node.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.servers import port_open

# Outside the checkout, so every clone on the machine reuses one build.
ROOTS = Path(os.environ.get("SEMEL_ROOTS", "/var/cache/semel/roots"))
MIRROR = os.environ.get("SEMEL_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SUITE = "trixie"
ROOT = ROOTS / f"{SUITE}-rabbitmq"
COMPLETE = ".semel-complete"  # written last: a half-built root is never used

PORT = 5673  # the shared test node; the machine's broker keeps 5672
NODE = "semel-rabbit4@localhost"
HOME = "/var/lib/semel-rabbit4"  # inside the root
URL = f"amqp://guest:guest@127.0.0.1:{PORT}/"
DIST_OFFSET = 20_000  # the node's distribution port is its AMQP port + this
BIN = "/usr/lib/rabbitmq/bin"
# Distribution on loopback only, like the machine's own node.
LOOPBACK_DIST = "-kernel inet_dist_use_interface {127,0,0,1}"


def _locked(path: Path) -> contextlib.AbstractContextManager[object]:
    path.parent.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def hold() -> Iterator[object]:
        with path.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield lock

    return hold()


def ensure_root() -> Path:
    """The Debian 13 root with rabbitmq-server, built the first time it is asked for."""
    if (ROOT / COMPLETE).exists():
        return ROOT
    # Test workers start together on a fresh machine: one builds, the others wait.
    with _locked(ROOTS / f".{SUITE}.lock"):
        if not (ROOT / COMPLETE).exists():
            _build(ROOT)
    return ROOT


def _build(root: Path) -> None:
    if os.geteuid() != 0:
        raise RuntimeError(f"the RabbitMQ 4 lane needs root to build {root} (debootstrap, chroot)")
    debootstrap = shutil.which("debootstrap") or _install_debootstrap()
    staging = root.with_name(root.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    started = time.monotonic()
    argv = [debootstrap, "--variant=minbase", "--include=rabbitmq-server", SUITE, str(staging)]
    done = subprocess.run(
        [*argv, MIRROR],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        check=False,
        timeout=1200,
    )
    if done.returncode != 0:
        tail = done.stdout.decode(errors="replace").splitlines()[-15:]
        raise RuntimeError("debootstrap failed:\n" + "\n".join(tail))
    (staging / COMPLETE).write_text(f"built in {time.monotonic() - started:.0f}s\n")
    shutil.rmtree(root, ignore_errors=True)
    staging.rename(root)


def _install_debootstrap() -> str:
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "debootstrap"], check=True, env=env, timeout=600
    )
    found = shutil.which("debootstrap")
    if found is None:
        raise RuntimeError("debootstrap is not on PATH after installing it")
    return found


def _mount_proc(root: Path) -> None:
    # Erlang reads /proc; one mount serves every node in the root.
    proc = root / "proc"
    if not (proc / "self").exists():
        subprocess.run(["mount", "-t", "proc", "proc", str(proc)], check=True)


def node_env(name: str, port: int, home: str) -> dict[str, str]:
    """What makes a node private: its name, ports and every path under ``home``."""
    return {
        "RABBITMQ_NODENAME": name,
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(port + DIST_OFFSET),
        "RABBITMQ_MNESIA_BASE": f"{home}/mnesia",
        "RABBITMQ_LOG_BASE": f"{home}/log",
        "RABBITMQ_PID_FILE": f"{home}/node.pid",
        "RABBITMQ_ENABLED_PLUGINS_FILE": f"{home}/enabled_plugins",
        "RABBITMQ_CONFIG_FILE": f"{home}/rabbitmq",
        "RABBITMQ_ADVANCED_CONFIG_FILE": f"{home}/advanced.config",
        "ERL_CRASH_DUMP": f"{home}/erl_crash.dump",
    }


@dataclass(frozen=True, slots=True)
class Node:
    """One RabbitMQ node run from the root: its name, AMQP port and home inside the root."""

    name: str
    port: int
    home: str  # a path inside the root
    root: Path = ROOT

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def outside(self, inside: str) -> Path:
        """Where a path inside the root is on the host."""
        return self.root / inside.lstrip("/")

    def env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "HOME": self.home,  # the Erlang cookie lives here, shared by server and CLI
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": LOOPBACK_DIST,
            **node_env(self.name, self.port, self.home),
        }

    def argv(self, program: str, *args: str) -> list[str]:
        """A RabbitMQ program run inside the root as the root's rabbitmq user."""
        return ["chroot", "--userspec=rabbitmq:rabbitmq", str(self.root), f"{BIN}/{program}", *args]

    def ctl(self, *args: str) -> list[str]:
        return self.argv("rabbitmqctl", "-n", self.name, *args)

    def prepare(self, config: str = "") -> None:
        """A home with our own config: the system one pins the listener to 5672."""
        _mount_proc(self.root)
        home = self.outside(self.home)
        home.mkdir(parents=True, exist_ok=True)
        (home / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.port}\n"
            "disk_free_limit.absolute = 50MB\n"
            "log.console = false\n" + config
        )
        (home / "enabled_plugins").write_text("[].\n")
        # By name inside the root: its rabbitmq user is not the host's.
        subprocess.run(
            ["chroot", str(self.root), "chown", "-R", "rabbitmq:rabbitmq", self.home], check=True
        )

    def start(self, deadline: float = 90.0) -> None:
        subprocess.run(self.argv("rabbitmq-server", "-detached"), env=self.env(), check=True)
        self.await_startup(deadline)

    def await_startup(self, deadline: float) -> None:
        # The detached server registers its name a moment after the command returns.
        end = time.monotonic() + deadline
        while True:
            done = subprocess.run(
                self.ctl("await_startup", "--timeout", "30"),
                env=self.env(),
                capture_output=True,
                check=False,
                timeout=60,
            )
            if done.returncode == 0:
                return
            if time.monotonic() > end:
                raise RuntimeError(f"RabbitMQ 4 node {self.name} did not start: {self.log_tail()}")
            time.sleep(0.5)

    def stop(self) -> None:
        subprocess.run(
            self.ctl("stop"), env=self.env(), capture_output=True, check=False, timeout=60
        )

    def log_tail(self, lines: int = 20) -> str:
        logs = sorted(self.outside(f"{self.home}/log").glob("*.log"))
        if not logs:
            return "(no node log)"
        return "\n".join(logs[-1].read_text(errors="replace").splitlines()[-lines:])


SHARED = Node(NODE, PORT, HOME)


def ensure_rabbitmq4() -> str:
    """The shared RabbitMQ 4 test node's URL, started unless it already listens."""
    if port_open(PORT):
        return URL
    ensure_root()
    with _locked(ROOTS / ".rabbit4-node.lock"):
        if not port_open(PORT):
            SHARED.prepare()
            SHARED.start()
    return URL


def version(node: Node = SHARED) -> str:
    done = subprocess.run(
        node.ctl("version"), env=node.env(), capture_output=True, check=True, timeout=60
    )
    return done.stdout.decode().strip()


if __name__ == "__main__":
    began = time.monotonic()
    ensure_rabbitmq4()
    print(f"rabbitmq4: up on {PORT} ({version()}) in {time.monotonic() - began:.0f}s")
    sys.exit(0)
