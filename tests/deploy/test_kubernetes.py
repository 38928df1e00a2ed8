"""deploy/k8s: Kubernetes and KEDA schemas, then the cross-references between objects."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from cloudcoil.models.keda.v1alpha1 import ScaledObject, TriggerAuthentication
from pydantic import BaseModel

from semel.settings import StoreKind
from tests.deploy.manifests import (
    K8S,
    Document,
    final_stage,
    k8s_documents,
    k8s_environment,
    k8s_files,
    k8s_object,
    k8s_setting,
    load_documents,
    load_settings_from,
    pod_spec,
)

pytestmark = pytest.mark.timeout(60)

# The oldest Kubernetes minor still widely run, and the newest the schemas cover.
K8S_VERSIONS = ["1.29.0", kubernetes_validate.latest_version() + ".0"]

KEDA_MODELS: dict[str, type[BaseModel]] = {
    "ScaledObject": ScaledObject,
    "TriggerAuthentication": TriggerAuthentication,
}

SECRET_SETTINGS = {"SEMEL_AMQP_URL", "SEMEL_POSTGRES_DSN", "SEMEL_REDIS_URL"}


def builtin_objects() -> list[Document]:
    return [doc for doc in k8s_documents() if not doc["apiVersion"].startswith("keda.sh/")]


def keda_objects() -> list[Document]:
    return [doc for doc in k8s_documents() if doc["apiVersion"].startswith("keda.sh/")]


def describe(doc: Document) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


# ---- schemas ----


def test_every_file_parses_to_named_objects() -> None:
    for doc in k8s_documents():
        assert {"apiVersion", "kind", "metadata"} <= doc.keys()
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("doc", builtin_objects(), ids=describe)
def test_builtin_kinds_match_the_kubernetes_schema(doc: Document, version: str) -> None:
    # Strict: an unknown or misspelt field fails instead of being dropped.
    kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("doc", keda_objects(), ids=describe)
def test_keda_kinds_match_the_keda_crd_models(doc: Document) -> None:
    assert doc["apiVersion"] == "keda.sh/v1alpha1"
    model = KEDA_MODELS[doc["kind"]].model_validate(doc)
    # The models ignore unknown fields and coerce types: a lossless round
    # trip proves every field is known and already of the right type.
    assert model.model_dump(by_alias=True, exclude_unset=True, mode="json") == doc


def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = load_documents(K8S / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    manifests = {p.name for p in k8s_files()} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(manifests)
    images = {image["name"] for image in kustomization["images"]}
    for kind in ("Deployment", "Job"):
        for container in pod_spec(kind)["containers"]:
            assert container["image"].split(":")[0] in images


def test_everything_lives_in_one_namespace() -> None:
    namespace = k8s_object("Namespace")["metadata"]["name"]
    (kustomization,) = load_documents(K8S / "kustomization.yaml")
    assert kustomization["namespace"] == namespace
    for doc in k8s_documents():
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace, describe(doc)


# ---- configuration ----


def test_secrets_are_in_the_secret_not_the_configmap() -> None:
    secret = k8s_object("Secret")
    assert "data" not in secret, "placeholders as stringData, readable and easy to replace"
    assert set(secret["stringData"]) >= SECRET_SETTINGS
    assert not SECRET_SETTINGS & set(k8s_object("ConfigMap")["data"])
    assert all("CHANGE-ME" in value for value in secret["stringData"].values())


def test_configmap_and_secret_load_as_valid_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings_from(k8s_environment(), monkeypatch)
    assert settings.store is not StoreKind.SQLITE, "a file store cannot be shared by replicas"


@pytest.mark.parametrize("kind", ["Deployment", "Job"])
def test_pods_take_their_settings_from_the_configmap_and_secret(kind: str) -> None:
    (container,) = pod_spec(kind)["containers"]
    refs = {
        (key, source[key]["name"])
        for source in container["envFrom"]
        for key in ("configMapRef", "secretRef")
        if key in source
    }
    assert refs == {
        ("configMapRef", k8s_object("ConfigMap")["metadata"]["name"]),
        ("secretRef", k8s_object("Secret")["metadata"]["name"]),
    }


# ---- the consumer Deployment ----


def consumer() -> Document:
    containers: list[Document] = pod_spec("Deployment")["containers"]
    (container,) = containers
    return container


def metrics_port() -> int:
    return int(k8s_setting("metrics_port"))


def test_deployment_runs_two_consumers_of_the_same_image_as_migrate() -> None:
    deployment = k8s_object("Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert consumer()["args"] == ["consume"]
    (migrate,) = pod_spec("Job")["containers"]
    assert migrate["args"] == ["migrate"]
    assert migrate["image"] == consumer()["image"]
    assert pod_spec("Job")["restartPolicy"] in ("Never", "OnFailure")


def test_probes_ask_healthz_and_readyz_on_the_metrics_port() -> None:
    container = consumer()
    (port,) = container["ports"]
    assert (port["name"], port["containerPort"]) == ("metrics", metrics_port())
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_prometheus_scrapes_the_metrics_port() -> None:
    annotations = k8s_object("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(metrics_port())
    assert annotations["prometheus.io/path"] == "/metrics"


def test_termination_grace_outlasts_the_handler_timeout() -> None:
    needed = float(k8s_setting("handler_timeout")) + float(k8s_setting("shutdown_grace"))
    assert pod_spec("Deployment")["terminationGracePeriodSeconds"] > needed


def test_resources_have_requests_and_limits() -> None:
    for kind in ("Deployment", "Job"):
        for container in pod_spec(kind)["containers"]:
            resources = container["resources"]
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= resources[bound].keys(), (kind, bound)


@pytest.mark.parametrize("kind", ["Deployment", "Job"])
def test_pods_run_unprivileged_on_a_read_only_root(kind: str) -> None:
    spec = pod_spec(kind)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    (container,) = spec["containers"]
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_pod_user_is_the_image_user() -> None:
    (user,) = [i.arguments for i in final_stage() if i.keyword == "USER"]
    uid, _, gid = user.partition(":")
    for kind in ("Deployment", "Job"):
        context = pod_spec(kind)["securityContext"]
        assert str(context["runAsUser"]) == uid
        assert str(context["runAsGroup"]) == (gid or uid)


# ---- objects that select the consumer pods ----


def pod_labels() -> dict[str, str]:
    labels: dict[str, str] = k8s_object("Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


def selects_consumers(selector: dict[str, Any]) -> bool:
    return selector.items() <= pod_labels().items()


def test_deployment_selector_matches_its_pods() -> None:
    assert selects_consumers(k8s_object("Deployment")["spec"]["selector"]["matchLabels"])


def test_disruption_budget_covers_the_consumers() -> None:
    pdb = k8s_object("PodDisruptionBudget")["spec"]
    assert selects_consumers(pdb["selector"]["matchLabels"])
    assert pdb.get("maxUnavailable") == 1 or pdb.get("minAvailable") == 1


def test_metrics_service_targets_the_consumers() -> None:
    service = k8s_object("Service")["spec"]
    assert selects_consumers(service["selector"])
    (port,) = service["ports"]
    assert port["targetPort"] == "metrics"
    assert port["port"] == metrics_port()


# ---- KEDA ----


def test_scaled_object_scales_the_deployment_on_the_work_queue() -> None:
    spec = k8s_object("ScaledObject")["spec"]
    target = spec["scaleTargetRef"]
    assert target["name"] == k8s_object("Deployment")["metadata"]["name"]
    assert target.get("kind", "Deployment") == "Deployment"
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]

    (trigger,) = spec["triggers"]
    assert trigger["type"] == "rabbitmq"
    metadata = trigger["metadata"]
    assert metadata["mode"] == "QueueLength"
    assert metadata["queueName"] == k8s_setting("queue")
    assert float(metadata["value"]) > 0
    authentication = k8s_object("TriggerAuthentication")
    assert trigger["authenticationRef"]["name"] == authentication["metadata"]["name"]


def test_trigger_authentication_reads_the_amqp_url_from_the_secret() -> None:
    (ref,) = k8s_object("TriggerAuthentication")["spec"]["secretTargetRef"]
    secret = k8s_object("Secret")
    assert ref["parameter"] == "host"
    assert ref["name"] == secret["metadata"]["name"]
    assert ref["key"] == "SEMEL_AMQP_URL"
    assert ref["key"] in secret["stringData"]
