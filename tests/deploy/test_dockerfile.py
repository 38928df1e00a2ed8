"""deploy/Dockerfile and .dockerignore: lint, structure, and the health check run for real."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from tests.deploy.manifests import (
    DOCKERFILE,
    DOCKERIGNORE,
    REPO,
    Instruction,
    default,
    dockerfile_instructions,
    final_stage,
    tool,
)

pytestmark = pytest.mark.timeout(60)

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def only(instructions: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in instructions if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {len(found)}"
    return found[0]


def test_hadolint_is_clean() -> None:
    result = subprocess.run(
        [tool("hadolint"), "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_multi_stage_on_slim_python_311() -> None:
    bases = [i.arguments.split()[0] for i in dockerfile_instructions() if i.keyword == "FROM"]
    assert len(bases) >= 2
    assert all(re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", base) for base in bases), bases


def test_build_stage_installs_the_package_with_every_store_from_wheels() -> None:
    build = [i for i in dockerfile_instructions() if i.stage == 0]
    (install,) = [i for i in build if i.keyword == "RUN" and "pip install" in i.arguments]
    words = shlex.split(install.arguments)
    assert ".[all]" in words
    assert "--only-binary=:all:" in words
    assert "all" in PYPROJECT["project"]["optional-dependencies"]


def test_final_stage_copies_the_venv_and_builds_nothing() -> None:
    final = final_stage()
    copies = [i.arguments for i in final if i.keyword == "COPY"]
    assert copies
    assert all(c.startswith("--from=build ") for c in copies), copies
    runs = " ".join(i.arguments for i in final if i.keyword == "RUN")
    for forbidden in ("pip install", "apt-get", "gcc", "build-essential"):
        assert forbidden not in runs


def test_every_package_the_readme_and_the_license_are_copied() -> None:
    # pyproject.toml decides what the wheel contains; the image must send it all.
    copied = {
        source.rstrip("/")
        for i in dockerfile_instructions()
        if i.keyword == "COPY" and not i.arguments.startswith("--from")
        for source in i.arguments.split()[:-1]
    }
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in include}
    assert packages <= copied
    assert {"pyproject.toml", PYPROJECT["project"]["readme"]} <= copied
    assert set(PYPROJECT["project"]["license-files"]) <= copied  # the build refuses without
    for source in copied:
        assert (REPO / source).exists(), f"COPY {source}: no such path"


def test_runs_as_a_numeric_non_root_user() -> None:
    user = only(final_stage(), "USER").arguments
    uid = user.split(":")[0]
    assert uid.isdigit(), "a numeric uid lets Kubernetes' runAsNonRoot verify it"
    assert int(uid) != 0


def test_entrypoint_command_signal_and_port() -> None:
    final = final_stage()
    assert json.loads(only(final, "ENTRYPOINT").arguments) == ["semel"]
    assert "semel" in PYPROJECT["project"]["scripts"]
    assert json.loads(only(final, "CMD").arguments) == ["consume"]
    assert only(final, "STOPSIGNAL").arguments == "SIGTERM"
    assert only(final, "EXPOSE").arguments == str(default("metrics_port"))


def test_python_output_is_unbuffered() -> None:
    env = " ".join(i.arguments for i in final_stage() if i.keyword == "ENV")
    assert re.search(r"\bPYTHONUNBUFFERED=1\b", env)


# ---- the HEALTHCHECK command, run against a stand-in metrics server ----


def healthcheck_command() -> list[str]:
    check = only(final_stage(), "HEALTHCHECK").arguments
    _, _, command = check.partition(" CMD ")
    argv: list[str] = json.loads(command)
    assert argv[0] == "python", "the slim image has no curl"
    return [sys.executable, *argv[1:]]


class _Metrics(BaseHTTPRequestHandler):
    status: ClassVar[int] = 200
    paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).paths.append(self.path)
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[tuple[int, type[_Metrics]]]:
    class Metrics(_Metrics):
        paths: ClassVar[list[str]] = []

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], Metrics
    finally:
        server.shutdown()
        server.server_close()


def run_healthcheck(port: int) -> int:
    env = os.environ | {"SEMEL_METRICS_PORT": str(port)}
    result = subprocess.run(
        healthcheck_command(), env=env, capture_output=True, timeout=30, check=False
    )
    return result.returncode


def test_healthcheck_passes_when_healthz_answers_200(
    metrics_server: tuple[int, type[_Metrics]],
) -> None:
    port, handler = metrics_server
    assert run_healthcheck(port) == 0
    assert handler.paths == ["/healthz"]


def test_healthcheck_fails_when_healthz_answers_an_error(
    metrics_server: tuple[int, type[_Metrics]],
) -> None:
    port, handler = metrics_server
    handler.status = 503
    assert run_healthcheck(port) != 0


def test_healthcheck_fails_when_nothing_listens() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert run_healthcheck(port) != 0


def test_healthcheck_passes_when_metrics_are_turned_off() -> None:
    assert run_healthcheck(0) == 0


# ---- .dockerignore ----


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    # Docker's rules: `*` and `?` stay within one path segment, `**` spans any.
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def in_build_context(path: str) -> bool:
    """Whether .dockerignore lets ``path`` (relative to the repo root) into the context."""
    rules = []
    for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negated = line.startswith("!")
            rules.append((negated, _pattern_regex(line.lstrip("!").strip("/"))))
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    included = True
    for negated, regex in rules:  # the last matching rule wins
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            included = negated
    return included


def copied_files() -> list[str]:
    files: list[str] = []
    for i in dockerfile_instructions():
        if i.keyword != "COPY" or i.arguments.startswith("--from"):
            continue
        for source in i.arguments.split()[:-1]:
            root = REPO / source
            paths = [root] if root.is_file() else root.rglob("*")
            files += [
                p.relative_to(REPO).as_posix()
                for p in paths
                if p.is_file() and "__pycache__" not in p.parts
            ]
    return files


def test_everything_the_dockerfile_copies_is_in_the_build_context() -> None:
    files = copied_files()
    assert files
    assert [f for f in files if not in_build_context(f)] == []


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        "semel.db",
        "semel.db-wal",
        "semel/consumer/__pycache__/cli.cpython-311.pyc",
        "deploy/k8s/secret.yaml",
    ],
)
def test_local_state_stays_out_of_the_build_context(path: str) -> None:
    assert not in_build_context(path)
