"""The wheel ``python -m build`` makes, and what installing it brings (issue #24, point 6)."""

from __future__ import annotations

import tomllib
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest

from tests.install.fresh import Venv, normalised
from tests.servers import ROOT

# The first test of a session waits for the wheel and the venv: about 25 s on
# a quiet machine, minutes on a loaded one or while the wheelhouse is filled
# from the index. Each step has a deadline of its own (tests/install/fresh.py).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PACKAGES = ("semel",)  # one top-level package: a project's own settings.py cannot shadow it


def files_of(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def metadata_of(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(archive.read(name).decode())


def sources(*patterns: str) -> set[str]:
    """The checkout's files of semel's packages that match, relative to the checkout."""
    return {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for pattern in patterns
        for path in (ROOT / package).rglob(pattern)
        if "__pycache__" not in path.parts
    }


def test_the_wheel_holds_semels_packages_and_no_tests(wheel: Path) -> None:
    files = files_of(wheel)
    dist_info = f"semel-{PROJECT['version']}.dist-info"
    assert {name.split("/")[0] for name in files} == {*PACKAGES, dist_info}
    assert not [name for name in files if name.startswith(("tests/", "bench/", "examples/"))]
    # Every module and the Redis store's Lua scripts, which are not Python.
    assert {name for name in files if not name.startswith(dist_info)} == sources("*.py", "*.lua")
    assert any(name.startswith("semel/stores/redis/scripts/") for name in files)
    assert f"{dist_info}/licenses/LICENSE" in files


def test_the_wheel_names_its_version_license_and_extras(wheel: Path) -> None:
    metadata = metadata_of(wheel)
    assert metadata["Version"] == PROJECT["version"]
    assert metadata["License-Expression"] == "MIT"
    extras = set(metadata.get_all("Provides-Extra") or [])
    assert {"postgres", "redis", "dynamodb", "otel", "tracing"} <= extras
    # `tracing`, the otel extra's first name, still installs what otel does.
    tracing = [r for r in metadata.get_all("Requires-Dist") or [] if 'extra == "tracing"' in r]
    assert [r.split(";")[0].strip() for r in tracing] == ["semel[otel]"]


def test_an_extra_installs_the_base_and_its_store_client_alone(venv: Venv) -> None:
    installed = venv.distributions()
    assert {"semel", "aio-pika", "aiormq", "redis", "hiredis"} <= installed
    others = {"psycopg", "psycopg-binary", "psycopg-pool", "boto3", "botocore"}
    others |= {"opentelemetry-api", "opentelemetry-sdk", "honcho", "matplotlib", "pytest"}
    assert installed & {normalised(name) for name in others} == set()


def test_a_store_whose_extra_is_not_installed_names_it(venv: Venv, tmp_path: Path) -> None:
    env = venv.environ(SEMEL_SQLITE_PATH=str(tmp_path / "semel.db"))
    assert venv.run("semel", "migrate", cwd=tmp_path, env=env).returncode == 0  # in the base
    refused = venv.run("semel", "migrate", cwd=tmp_path, env=env | {"SEMEL_STORE": "postgres"})
    assert refused.returncode == 2
    assert "pip install 'semel[postgres]'" in refused.stderr, refused.stderr


def test_semel_says_its_version(venv: Venv, tmp_path: Path) -> None:
    said = venv.run("semel", "--version", cwd=tmp_path)
    assert (said.returncode, said.stdout) == (0, f"semel {PROJECT['version']}\n")
