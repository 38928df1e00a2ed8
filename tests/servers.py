"""Real servers for the tests: start what is not running, on loopback only.

PostgreSQL, Redis and RabbitMQ are system services on the test machine
(scripts/system-packages installs them on Debian); they are started with
their usual commands when their port is closed, which also works where no
init system runs them (a container, a chroot). The two
DynamoDB-compatible servers (moto's server mode and dynalite) are child
processes of the test session on free ports.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
DYNALITE_VERSION = "4.0.0"

SYSTEM_SERVICES: dict[str, tuple[int, str]] = {
    "postgres": (
        5432,
        "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
    ),
    "redis": (
        6379,
        'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" '
        "--appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log",
    ),
    "rabbitmq": (5672, "rabbitmq-server -detached"),
}

# The suite's PostgreSQL (tests/conftest.py): the OS user, no password, over TCP.
POSTGRES_TEST_DSN = "postgresql://localhost/test"

# Where Redis's command above keeps its files; it will not start without them.
REDIS_DIRS = ("/var/lib/redis", "/var/log/redis")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.closing(socket.socket()) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


class ServerExited(RuntimeError):
    """The process that was to listen on the port ended before it did."""


def wait_for_port(
    port: int,
    deadline: float,
    host: str = "127.0.0.1",
    process: subprocess.Popen[bytes] | None = None,
) -> None:
    """Until something listens on ``port``; with ``process``, fail as soon as it ends
    (a port it could not bind) rather than after ``deadline``."""
    end = time.monotonic() + deadline
    while not port_open(port, host):
        if process is not None and process.poll() is not None:
            raise ServerExited(f"the server for {host}:{port} exited ({process.returncode})")
        if time.monotonic() > end:
            raise RuntimeError(f"nothing listens on {host}:{port} after {deadline:g}s")
        time.sleep(0.05)


# Where free_port looks: above the well-known services, below the kernel's
# ephemeral range (Linux's default is 32768-60999).
PORTS_FROM = 15000
_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        low, high = (int(part) for part in text.split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A port nothing is bound to, outside the kernel's ephemeral range.

    A port the kernel picks for port 0 comes from the range it also gives every
    outgoing connection: between our choosing it and a server binding it, one of
    the suite's many client sockets could take it, and the server could not
    start (seen once: a cluster node of the bench smoke test). Below that range
    only another free_port competes, and a random pick among some 17,000 ports
    makes that unlikely; a port is never handed out twice by one process.
    """
    ephemeral_low, ephemeral_high = _ephemeral_range()
    low, high = PORTS_FROM, ephemeral_low
    if high - low < 1000:  # an unusual range that starts low: above it, or within it
        low, high = (ephemeral_high + 1, 65536) if ephemeral_high < 64535 else (1024, 65536)
    for _ in range(200):
        port = random.randrange(low, high)
        if port in _handed_out:
            continue
        with contextlib.closing(socket.socket()) as sock:
            try:
                sock.bind(("", port))  # the wildcard conflicts with any address bound
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port between {low} and {high} after 200 tries")


def ensure_service(name: str, deadline: float = 90.0) -> None:
    """Start a system service with its usual command unless it already listens."""
    port, command = SYSTEM_SERVICES[name]
    if not port_open(port):
        _start(name, command, port, deadline)
    if name == "postgres":
        _check_postgres()


def _start(name: str, command: str, port: int, deadline: float) -> None:
    if name == "redis":
        for directory in REDIS_DIRS:
            # Not ours to create as an ordinary user: Redis then says why it cannot start.
            with contextlib.suppress(PermissionError):
                Path(directory).mkdir(parents=True, exist_ok=True)
    subprocess.run(command, shell=True, check=False)  # noqa: S602 - fixed command
    wait_for_port(port, deadline)
    if name == "rabbitmq":
        # The port opens before the vhost is ready; wait for the app itself.
        subprocess.run(["rabbitmqctl", "await_startup"], check=False, timeout=deadline)


def _check_postgres() -> None:
    """Fail in one line when the suite cannot log in, instead of in every PostgreSQL test.

    A PostgreSQL that scripts/system-packages installed is set up for the suite;
    one that was already there is the machine owner's to set up.
    """
    # Imported here: the rest of this module runs with the standard library alone.
    import psycopg

    try:
        psycopg.connect(POSTGRES_TEST_DSN, connect_timeout=10).close()
    except psycopg.OperationalError as exc:
        user = pwd.getpwuid(os.geteuid()).pw_name
        reason = " ".join(str(exc).split()).rpartition("FATAL: ")[2]
        raise RuntimeError(
            f"PostgreSQL on localhost refuses {POSTGRES_TEST_DSN} as {user} ({reason}):"
            f" createuser --superuser {user}; createdb --owner {user} test;"
            " and trust 127.0.0.1/32 and ::1/128 for it in pg_hba.conf"
        ) from exc


@contextlib.contextmanager
def _child(argv: list[str], port: int, log_name: str) -> Iterator[str]:
    CACHE.mkdir(exist_ok=True)
    with (CACHE / log_name).open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=CACHE)
    try:
        wait_for_port(port, 60.0, process=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """moto's server mode: a full DynamoDB API, TTL included, one request at a time.

    Serialised because moto's threaded server does not apply a conditional
    write atomically (see tests/moto_serial.py).
    """
    port = free_port()
    argv = [sys.executable, str(ROOT / "tests" / "moto_serial.py"), str(port)]
    with _child(argv, port, "moto.log") as url:
        yield url


def dynalite_bin() -> Path:
    """Install dynalite from npm into .cache once; return its launcher."""
    prefix = CACHE / "dynalite"
    launcher = prefix / "node_modules" / ".bin" / "dynalite"
    if launcher.exists():
        return launcher
    CACHE.mkdir(parents=True, exist_ok=True)
    # Test workers start at once on a fresh clone, and two npm installs into
    # one prefix break each other: one installs while the others wait.
    with (CACHE / "dynalite.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not launcher.exists():
            _npm_install(prefix)
    return launcher


def _npm_install(prefix: Path) -> None:
    """Install into a staging prefix and move it in whole: a broken install is never used."""
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is needed to run dynalite")
    staging = prefix.with_name(prefix.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    subprocess.run(
        [
            npm,
            "install",
            "--prefix",
            str(staging),
            "--no-save",
            "--no-package-lock",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            f"dynalite@{DYNALITE_VERSION}",
        ],
        check=True,
        timeout=300,
    )
    shutil.rmtree(prefix, ignore_errors=True)
    staging.rename(prefix)


@contextlib.contextmanager
def dynalite_server() -> Iterator[str]:
    """dynalite: an independent DynamoDB implementation, in memory, with no TTL API."""
    port = free_port()
    with _child([str(dynalite_bin()), "--port", str(port)], port, "dynalite.log") as url:
        yield url


def aws_test_credentials() -> None:
    """Local servers accept any credentials; never let a test reach real AWS."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ.setdefault(name, value)


if __name__ == "__main__":
    # `python -m tests.servers`: start the system services the suite needs.
    for service in SYSTEM_SERVICES:
        try:
            ensure_service(service)
        except RuntimeError as exc:
            sys.exit(f"{service}: {exc}")
        print(f"{service}: up")
