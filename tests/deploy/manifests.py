"""The files under ``deploy/``, loaded and parsed for the deployment tests."""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from semel.settings import Settings, load_settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
COMPOSE = DEPLOY / "compose.yaml"
K8S = DEPLOY / "k8s"
YAMLLINT_CONFIG = DEPLOY / ".yamllint"

# Every file of ours that may name a setting.
DEPLOY_FILES = [DOCKERFILE, COMPOSE, DEPLOY / "README.md", *sorted(K8S.glob("*.yaml"))]

SETTING_NAME = re.compile(r"\bSEMEL_[A-Z][A-Z0-9_]*\b")

Document = dict[str, Any]


def setting_names() -> set[str]:
    """Every environment variable semel reads as a setting: SEMEL_ + field name."""
    return {"SEMEL_" + name.upper() for name in Settings.model_fields}


def default(field: str) -> Any:
    """A setting's default, straight from the model."""
    return Settings.model_fields[field].default


def tool(name: str) -> str:
    """The path of a command-line tool installed with the dev extra."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[dev]'")
    return found


# ---- YAML ----


def load_documents(path: Path) -> list[Document]:
    """Every non-empty YAML document in ``path``, each required to be a mapping."""
    documents = [
        doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None
    ]
    for doc in documents:
        assert isinstance(doc, dict), f"{path.name}: a document is not a mapping"
    return documents


def compose() -> Document:
    (document,) = load_documents(COMPOSE)
    return document


def k8s_files() -> list[Path]:
    return sorted(K8S.glob("*.yaml"))


def k8s_documents() -> list[Document]:
    """Every Kubernetes object of the manifests (the kustomization is not one)."""
    return [
        doc
        for path in k8s_files()
        if path.name != "kustomization.yaml"
        for doc in load_documents(path)
    ]


def k8s_object(kind: str) -> Document:
    """The one object of ``kind``; the manifests hold exactly one of each."""
    found = [doc for doc in k8s_documents() if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def pod_spec(kind: str) -> Document:
    spec: Document = k8s_object(kind)["spec"]["template"]["spec"]
    return spec


def k8s_environment() -> dict[str, str]:
    """The environment a semel pod gets: the ConfigMap plus the Secret."""
    config: dict[str, str] = k8s_object("ConfigMap")["data"]
    secret: dict[str, str] = k8s_object("Secret")["stringData"]
    return config | secret


def k8s_setting(field: str) -> Any:
    """A setting as the pods see it: the ConfigMap's value, else the default."""
    return k8s_environment().get("SEMEL_" + field.upper(), default(field))


# ---- compose ----

_INTERPOLATION = re.compile(r"\$\{(?P<name>\w+)(?::?-(?P<default>[^}]*))?\}")


def interpolate(value: str) -> str:
    """``${VAR:-default}`` as compose resolves it when VAR is unset."""
    return _INTERPOLATION.sub(lambda m: m.group("default") or "", value)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}


def duration_seconds(value: str) -> float:
    """A compose duration (``90s``, ``1m30s``) in seconds."""
    parts = _DURATION.findall(value)
    assert parts, f"not a duration: {value!r}"
    assert "".join(n + u for n, u in parts) == value, f"not a duration: {value!r}"
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


# ---- Dockerfile ----


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction, continuation lines joined."""

    keyword: str
    arguments: str
    stage: int  # 0 for the first FROM's stage, 1 for the next, ...


def dockerfile_instructions() -> list[Instruction]:
    instructions: list[Instruction] = []
    stage = -1
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, arguments = (pending + line).partition(" ")
        pending = ""
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(keyword, arguments.strip(), stage))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def final_stage() -> list[Instruction]:
    instructions = dockerfile_instructions()
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


# ---- settings ----

# Read by Settings as fallbacks: must not leak from the test's environment.
_FALLBACK_VARIABLES = {
    "AMQP_URL",
    "CLOUDAMQP_URL",
    "DATABASE_URL",
    "REDIS_URL",
    "AWS_ENDPOINT_URL_DYNAMODB",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
}


def load_settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The Settings a semel process started with exactly ``env`` would load."""
    for name in list(os.environ):
        if name.startswith("SEMEL_") or name in _FALLBACK_VARIABLES:
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return load_settings()
