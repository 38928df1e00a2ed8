"""semel as a user gets it: the wheel ``python -m build`` makes, installed into a fresh venv.

Both are made once per test session and shared by xdist's workers (one makes
them under a file lock, the others wait), in the session's temporary folder:
outside the checkout, so nothing there can import semel from the checkout by
accident. The venv holds ``semel[redis]`` and what it depends on, nothing else.

Its dependencies come from a wheelhouse in ``.cache``, downloaded from the
package index once per set of requirements: on this machine's network pip
spends about a minute asking the index for them, against a few seconds from
the wheelhouse, and the venv is as fresh either way.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.servers import CACHE, ROOT

# The one store client the venv gets: the extras test checks no other came with it.
EXTRA = "redis"


@dataclass(frozen=True)
class Venv:
    """A venv semel was installed into, and how to run its commands as a user would."""

    root: Path

    def command(self, name: str) -> str:
        return str(self.root / "bin" / name)

    def environ(self, **extra: str) -> dict[str, str]:
        """A shell's environment with this venv activated and nothing of the checkout:
        no ``SEMEL_*`` variable, no ``PYTHONPATH``, the checkout's venv off ``PATH``."""
        dev_bin = str(Path(sys.prefix) / "bin")
        path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != dev_bin]
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith("SEMEL_") and name not in ("PYTHONPATH", "PYTHONHOME")
        }
        env["PATH"] = os.pathsep.join([str(self.root / "bin"), *path])
        env["VIRTUAL_ENV"] = str(self.root)
        return env | extra

    def run(self, *argv: str, cwd: Path, env: dict[str, str] | None = None) -> Completed:
        """Run one of the venv's commands in ``cwd``; its exit code is the caller's to check."""
        return subprocess.run(
            [self.command(argv[0]), *argv[1:]],
            cwd=cwd,
            env=env or self.environ(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def distributions(self) -> set[str]:
        """The normalised names of every distribution installed in the venv."""
        listing = "import importlib.metadata as m; print(*(d.name for d in m.distributions()))"
        names = run([self.command("python"), "-c", listing]).stdout.split()
        return {normalised(name) for name in names}


Completed = subprocess.CompletedProcess[str]


def normalised(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return name.lower().replace("_", "-").replace(".", "-")


def run(argv: list[str], timeout: float = 180) -> Completed:
    """Run a set-up step; the test fails with the step's output if it fails."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def session_folder(base: Path) -> Path:
    """The folder every worker of this test run shares (``base``: pytest's basetemp)."""
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def built_wheel(folder: Path) -> Path:
    """The wheel ``python -m build`` makes of the checkout (an sdist, then the wheel
    built from it), made once in ``folder``."""
    dist = folder / "dist"
    with locked(folder / "build.lock"):
        if not dist.exists():
            staging = folder / "dist.partial"
            shutil.rmtree(staging, ignore_errors=True)
            run([sys.executable, "-m", "build", "--outdir", str(staging), str(ROOT)])
            staging.rename(dist)
    (wheel,) = dist.glob("semel-*.whl")
    return wheel


def fresh_venv(folder: Path, wheel: Path) -> Venv:
    """A venv with ``semel[redis]`` installed from ``wheel``, made once in ``folder``."""
    venv = Venv(folder / "venv")
    done = venv.root / ".installed"
    with locked(folder / "venv.lock"):
        if not done.exists():
            shutil.rmtree(venv.root, ignore_errors=True)
            # No pip of its own: the checkout's installs into it (--python), and
            # the venv holds semel and its dependencies alone.
            run([sys.executable, "-m", "venv", "--without-pip", str(venv.root)])
            run(
                [
                    *(sys.executable, "-m", "pip", "--python", venv.command("python")),
                    # --no-compile: byte-compiling every module took longer than
                    # the rest of the install; Python compiles what it imports.
                    *("install", "--quiet", "--no-compile", "--no-index"),
                    *("--find-links", str(wheelhouse(wheel))),
                    f"{wheel}[{EXTRA}]",
                ]
            )
            done.touch()
    return venv


def wheelhouse(wheel: Path) -> Path:
    """Wheels of everything ``semel[redis]`` needs, downloaded once per set of requirements."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        # What the venv installs: the base and the one extra (a change to
        # another extra needs no new download).
        requires = [
            line
            for line in archive.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:")
            and ("extra ==" not in line or f'extra == "{EXTRA}"' in line)
        ]
    key = hashlib.sha256("\n".join([sys.version, EXTRA, *requires]).encode()).hexdigest()[:16]
    house = CACHE / "wheelhouse" / key
    house.parent.mkdir(parents=True, exist_ok=True)
    with locked(house.parent / "fill.lock"):
        if not house.exists():
            staging = house.with_suffix(".partial")
            shutil.rmtree(staging, ignore_errors=True)
            download = [sys.executable, "-m", "pip", "download", "--quiet", "--dest"]
            run([*download, str(staging), f"{wheel}[{EXTRA}]"], timeout=600)
            for own in staging.glob("semel-*"):  # the wheel under test is installed by path
                own.unlink()
            for stale in house.parent.iterdir():  # earlier requirements' wheels
                if stale.is_dir() and stale != staging:
                    shutil.rmtree(stale)
            staging.rename(house)
    return house
