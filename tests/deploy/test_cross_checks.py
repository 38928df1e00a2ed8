"""What the deploy files say about semel must be true of semel: settings and commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from semel.consumer.commands.app import app
from tests.deploy.manifests import (
    DEPLOY,
    DEPLOY_FILES,
    SETTING_NAME,
    YAMLLINT_CONFIG,
    compose,
    final_stage,
    pod_spec,
    setting_names,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("path", DEPLOY_FILES, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_every_semel_variable_named_is_a_real_setting(path: Path) -> None:
    unknown = set(SETTING_NAME.findall(path.read_text(encoding="utf-8"))) - setting_names()
    assert not unknown, f"{path.name} names settings that do not exist: {sorted(unknown)}"


def command_lines() -> list[list[str]]:
    """Every `semel ...` argument list the image, compose and Kubernetes run."""
    (cmd,) = [i.arguments for i in final_stage() if i.keyword == "CMD"]
    lines: list[list[str]] = [json.loads(cmd)]
    lines += [spec["command"] for spec in compose()["services"].values() if "build" in spec]
    lines += [c["args"] for kind in ("Deployment", "Job") for c in pod_spec(kind)["containers"]]
    return lines


@pytest.mark.parametrize("argv", command_lines(), ids=" ".join)
def test_every_command_line_parses_with_the_semel_cli(argv: list[str]) -> None:
    commands: dict[str, Any] = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    if argv[0] not in commands:
        pytest.skip(f"`semel {argv[0]}` is not in the CLI yet")
    # Parses and type-checks the options without running the command.
    commands[argv[0]].make_context(argv[0], argv[1:])


def test_yamllint_is_clean() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "yamllint", "--strict", "-c", str(YAMLLINT_CONFIG), str(DEPLOY)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
