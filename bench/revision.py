"""Another revision of semel, to be measured beside this checkout in the same run.

The revision (any git ref of this repository) is exported with ``git archive``
into a cache folder outside the checkout, ``<cache>/revs/<full sha>/``, with a
virtualenv of its own holding that revision's package and its store extras.
The checkout's work tree and index are never touched, and a second run with
the same commit reuses the folder.

Its consumer runs as ``<venv>/bin/python -m <package>`` with the export as the
working directory. The bench's handler cannot be shipped as it is: it imports
this checkout's ``semel``, and putting the checkout on the revision's path
would run this checkout's code under the revision's name. The revision gets a
one-file handler of its own instead, written next to its venv, that does the
same work (none).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.broker import BenchError
from bench.children import ROOT, Child, semel_env
from bench.probes import SENT_HEADER
from semel.settings import Settings

CACHE_ENV = "BENCH_REVISION_CACHE"  # the cache folder, instead of ~/.cache/semel-bench
STORE_EXTRAS = ("redis", "postgres", "dynamodb")
# What ``python -m`` runs the consumer as: today's package, then the layout before
# everything moved under one ``semel`` package.
CONSUMER_MODULES = ("semel", "consumer")
HANDLER_MODULE = "semel_bench_handler"
READY = "ready.json"  # written last: a folder without it is rebuilt
BUILD_FORMAT = 1  # raised when the build changes: older folders are then rebuilt
NOT_COMPARED = ("semel", "pip", "setuptools", "wheel")  # the code itself, and the installers
PIP_TIMEOUT = 900.0  # seconds for installing one revision, a cold pip cache included

HANDLER_SOURCE = f'''"""The benchmark's handler for a revision measured beside the
checkout: it reads the latency header as bench.handlers.handle does, and does
nothing else. It imports nothing from semel, whose modules differ between
revisions."""


async def handle(context):
    context.headers.get("{SENT_HEADER}")
'''


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "semel-bench"


@dataclass(frozen=True)
class Revision:
    """A revision ready to run: its export, its venv and the module its consumer is."""

    ref: str  # as the user named it
    sha: str
    home: Path

    @property
    def source(self) -> Path:
        return self.home / "src"

    @property
    def python(self) -> Path:
        return self.home / "venv" / "bin" / "python"

    @property
    def handler_dir(self) -> Path:
        return self.home / "handler"

    @property
    def handler(self) -> str:
        return f"{HANDLER_MODULE}:handle"

    @property
    def label(self) -> str:
        return self.sha[:7]

    @property
    def module(self) -> str:
        for name in CONSUMER_MODULES:
            if (self.source / name / "__main__.py").is_file():
                return name
        raise BenchError(f"{self.ref} ({self.label}) has no python -m semel nor -m consumer")

    def start(self, name: str, settings: Settings, logs: Path) -> Child:
        """Its consumer on ``settings``, with its own handler and nothing of this
        checkout on the path."""
        settings = settings.model_copy(update={"handler": self.handler})
        argv = [str(self.python), "-m", self.module]
        env = semel_env(settings)
        return Child.start(name, argv, env, logs, cwd=self.source, path=self.handler_dir)


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise BenchError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def resolve(ref: str) -> str:
    """The full commit sha ``ref`` names in this repository."""
    try:
        return git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except BenchError:
        raise BenchError(f"--against {ref}: not a commit of this repository") from None


def this_checkout() -> dict[str, object]:
    """What the checkout's side of a comparison runs: HEAD, and the files of the
    measured package that differ from it."""
    changed = git("status", "--porcelain", "--", "semel", "pyproject.toml").splitlines()
    return {"sha": git("rev-parse", "HEAD"), "dirty": bool(changed), "changed": changed}


def prepare(ref: str, cache: Path | None = None, note: Callable[[str], None] = print) -> Revision:
    """The revision ``ref`` exported and installed, built now unless the cache has it."""
    sha = resolve(ref)
    revs = (cache or cache_root()) / "revs"
    revs.mkdir(parents=True, exist_ok=True)
    revision = Revision(ref, sha, revs / sha)
    # Two runs building the same commit at once would install into one venv.
    with (revs / f"{sha}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _built(revision):
            note(f"building {ref} ({revision.label}) in {revision.home}")
            began = time.monotonic()
            _build(revision)
            note(f"built {revision.label} in {time.monotonic() - began:.0f} s")
        _write_handler(revision)  # the handler of this checkout's bench, every run
        _check_runs_its_own_code(revision)
    return revision


def _build(revision: Revision) -> None:
    shutil.rmtree(revision.home, ignore_errors=True)
    revision.source.mkdir(parents=True)
    _export(revision.sha, revision.source)
    subprocess.run(
        [sys.executable, "-m", "venv", str(revision.home / "venv")],
        check=True,
        capture_output=True,
    )
    target = f"{revision.source}[{','.join(_extras(revision.source))}]"
    # The dependencies at this venv's versions, where the revision allows them: what
    # is compared is then semel's code, not a newer aio-pika or redis client.
    ours = _versions()
    pins = revision.home / "constraints.txt"
    pins.write_text("\n".join(f"{name}=={version}" for name, version in ours.items()))
    install = [str(revision.python), "-m", "pip", "install", "--quiet", target]
    # pip's own cache (not disabled here) makes a second build quick.
    done = _pip([*install, "--constraint", str(pins)])
    if done.returncode != 0:  # the revision wants other versions: let it have them
        done = _pip(install)
    if done.returncode != 0:
        raise BenchError(f"installing {revision.label} failed: {done.stderr[-2000:]}")
    differ = {
        name: {"revision": version, "checkout": ours.get(name)}
        for name, version in _versions(revision.python).items()
        if ours.get(name) != version
    }
    (revision.home / READY).write_bytes(
        orjson.dumps({"format": BUILD_FORMAT, "sha": revision.sha, "differ": differ})
    )


def _pip(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT)


def _versions(python: Path | None = None) -> dict[str, str]:
    """Installed distributions and versions, semel itself left out."""
    done = subprocess.run(
        [str(python or sys.executable), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        check=True,
    )
    listed = orjson.loads(done.stdout)
    return {
        d["name"].lower(): d["version"] for d in listed if d["name"].lower() not in NOT_COMPARED
    }


def dependency_differences(revision: Revision) -> dict[str, dict[str, str | None]]:
    """Distributions whose version differs between the revision's venv and this one."""
    ready = orjson.loads((revision.home / READY).read_bytes())
    differ: dict[str, dict[str, str | None]] = ready["differ"]
    return differ


def _export(sha: str, into: Path) -> None:
    """The commit's tree, without the checkout's index or work tree."""
    archive = subprocess.Popen(["git", "archive", "--format=tar", sha], cwd=ROOT, stdout=-1)
    assert archive.stdout is not None
    with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
        tar.extractall(into, filter="data")
    if archive.wait() != 0:
        raise BenchError(f"git archive {sha} failed")


def _extras(source: Path) -> list[str]:
    """The store extras that revision's pyproject offers."""
    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    offered = project.get("optional-dependencies", {})
    return [extra for extra in STORE_EXTRAS if extra in offered]


def _write_handler(revision: Revision) -> None:
    revision.handler_dir.mkdir(exist_ok=True)
    (revision.handler_dir / f"{HANDLER_MODULE}.py").write_text(HANDLER_SOURCE)


def _built(revision: Revision) -> bool:
    """Whether the cache holds the revision, built as this code builds it, in a venv
    that still starts (its base Python may have moved)."""
    try:
        ready = orjson.loads((revision.home / READY).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    if ready.get("format") != BUILD_FORMAT:
        return False
    try:
        done = subprocess.run([str(revision.python), "-c", "pass"], capture_output=True)
    except OSError:
        return False
    return done.returncode == 0


def _check_runs_its_own_code(revision: Revision) -> None:
    """The consumer module and the handler, as the child will import them, come from
    the revision's folder: never from this checkout."""
    probe = (
        "import importlib.util, sys\n"
        "for name in sys.argv[1:]:\n"
        "    print(importlib.util.find_spec(name).origin)\n"
    )
    done = subprocess.run(
        [str(revision.python), "-c", probe, revision.module, HANDLER_MODULE],
        cwd=revision.source,
        env=os.environ | {"PYTHONPATH": str(revision.handler_dir)},
        capture_output=True,
        text=True,
    )
    origins = [Path(line) for line in done.stdout.split()]
    if done.returncode != 0 or not all(o.is_relative_to(revision.home) for o in origins):
        raise BenchError(f"{revision.label} would not run its own code: {done.stdout}{done.stderr}")
