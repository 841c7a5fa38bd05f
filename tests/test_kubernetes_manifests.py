"""The Kubernetes manifests (`deploy/kubernetes/`, issue 35), validated, not guessed: no
cluster runs here, so every object is checked offline against the Kubernetes API's own
schemas (`kubernetes-validate`, which bundles them; strict: an unknown or misspelt field is
an error), for the oldest Kubernetes the manifests need and the newest the package knows.

Then what no schema can say: the probes ask the gateway's own health route on the port the
gateway listens on, the Service, the PodDisruptionBudget and the NetworkPolicy select the
Deployment's pods, every Secret and ConfigMap named exists (made by kustomize from files
the operator fills in, whose committed examples the gateway itself accepts), the gateway's
environment is settings it accepts, the grace period covers the drain, the engine's
resources hold the kernels, and what the API server would refuse on admission.

`kustomize` itself is run where `kubectl` is installed (its output validated the same way).
"""

from __future__ import annotations

import base64
import copy
import functools
import ipaddress
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.app import routes
from gateway.auth import TokenTable
from gateway.handlers.ops import STORE_PING_TIMEOUT
from gateway.sandbox.kernelspec import SOCKET_PATH_MAX
from gateway.sandbox.uids import LEASE_DIR
from gateway.settings import Settings, load
from gateway.store.instance import MACHINE_LOCK_FOLDERS
from tests.support import REPO

pytestmark = pytest.mark.fast

HERE = REPO / "deploy" / "kubernetes"
# The oldest Kubernetes the manifests need (sidecar init containers, 1.29; the preStop
# `sleep` action, 1.30; both on by default from 1.30) and the newest kubernetes-validate
# bundles: the schemas of both must accept every object.
KUBERNETES_VERSIONS = ("1.30", "1.37")
HEALTH = "/v1/health"
GATEWAY = "gateway"  # the gateway's container
ENGINE = "engine"  # the Docker engine beside it (a sidecar)
PULL = "kernel-image"  # the init container that pulls the kernel image into the engine
A_POD_NAME = "kernel-gateway-6d9f7c5b8d-x2x7q"  # what metadata.name gives a replica
DRAIN_MARGIN = 20  # seconds after the drain: destroying the sandboxes, closing the store


# --- reading the folder as kustomize would --------------------------------------------------


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    """The objects of a YAML file (a copy each time: tests may change what they get)."""
    return copy.deepcopy(_parsed(path, path.stat().st_mtime_ns))


@functools.cache
def _parsed(path: Path, mtime: int) -> list[dict[str, Any]]:
    documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    assert documents, f"{path.name} holds no object"
    for document in documents:
        assert isinstance(document, dict), f"{path.name}: not a mapping"
    return documents


def kustomization() -> dict[str, Any]:
    (document,) = yaml_documents(HERE / "kustomization.yaml")
    return document


def manifest_files() -> list[Path]:
    return sorted(p for p in HERE.glob("*.yaml") if p.name != "kustomization.yaml")


def manifests() -> list[dict[str, Any]]:
    return [d for path in manifest_files() for d in yaml_documents(path)]


def env_file(path: Path) -> dict[str, str]:
    """A kustomize env file: KEY=VALUE lines; blank lines and `#` comments skipped."""
    values: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and key.strip() == key and key, f"{path.name}: not KEY=VALUE: {line!r}"
        assert key not in values, f"{path.name}: {key} twice"
        values[key] = value
    return values


def example(path: str) -> Path:
    """A generator's file, or its committed example (the operator's own is not committed)."""
    return HERE / (path + ".example")


def generator_data(spec: dict[str, Any]) -> dict[str, str]:
    data: dict[str, str] = {}
    for path in spec.get("envs", []):
        real = HERE / path
        data.update(env_file(real if real.name == "settings.env" else example(path)))
    for path in spec.get("files", []):
        data[Path(path).name] = example(path).read_text(encoding="utf-8")
    assert data, f"generator {spec['name']} makes nothing"
    return data


def generated() -> list[dict[str, Any]]:
    """The ConfigMaps and Secrets kustomize makes (with the examples in the secrets' place),
    under the names the manifests use (kustomize adds a hash to each and to each use)."""
    namespace = kustomization()["namespace"]
    objects = []
    for spec in kustomization().get("configMapGenerator", []):
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": spec["name"], "namespace": namespace},
                "data": generator_data(spec),
            }
        )
    for spec in kustomization().get("secretGenerator", []):
        data = {
            key: base64.b64encode(value.encode()).decode()
            for key, value in generator_data(spec).items()
        }
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": {"name": spec["name"], "namespace": namespace},
                "data": data,
            }
        )
    return objects


def everything() -> list[dict[str, Any]]:
    return manifests() + generated()


def the(kind: str, objects: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    found = [o for o in (objects or everything()) if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def named(kind: str, name: str) -> dict[str, Any] | None:
    for obj in everything():
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    return None


def pod() -> dict[str, Any]:
    spec: dict[str, Any] = the("Deployment")["spec"]["template"]["spec"]
    return spec


def all_containers() -> list[dict[str, Any]]:
    return [*pod().get("initContainers", []), *pod()["containers"]]


def container(name: str) -> dict[str, Any]:
    (found,) = [c for c in all_containers() if c["name"] == name]
    return found


def secret_value(name: str, key: str) -> str:
    secret = named("Secret", name)
    assert secret is not None, f"no Secret {name}"
    return base64.b64decode(secret["data"][key]).decode()


def environment(c: dict[str, Any]) -> dict[str, str]:
    """A container's environment as the kubelet would give it (envFrom, then env)."""
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        if "configMapRef" in source:
            config = named("ConfigMap", source["configMapRef"]["name"])
            assert config is not None, f"no ConfigMap {source['configMapRef']['name']}"
            env.update(config["data"])
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var["valueFrom"]
        if "secretKeyRef" in ref:
            env[var["name"]] = secret_value(ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"])
        elif "configMapKeyRef" in ref:
            config = named("ConfigMap", ref["configMapKeyRef"]["name"])
            assert config is not None
            env[var["name"]] = config["data"][ref["configMapKeyRef"]["key"]]
        elif ref.get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[var["name"]] = A_POD_NAME
        else:
            raise AssertionError(f"{c['name']}: {var['name']} from a source this test cannot tell")
    return env


def gateway_settings() -> Settings:
    return load(environ=environment(container(GATEWAY)))


def mount_of(c: dict[str, Any], path: str | Path) -> dict[str, Any] | None:
    """The mount of `c` that holds `path` (the deepest)."""
    path = Path(path)
    holding = [m for m in c.get("volumeMounts", []) if path.is_relative_to(m["mountPath"])]
    return max(holding, key=lambda m: len(m["mountPath"]), default=None)


def volume(name: str) -> dict[str, Any]:
    (found,) = [v for v in pod()["volumes"] if v["name"] == name]
    return found


def port_number(c: dict[str, Any], port: int | str) -> int:
    """A probe's or Service's port (a number, or a name of the container's ports)."""
    for declared in c.get("ports", []):
        if port in (declared["containerPort"], declared.get("name")):
            number: int = declared["containerPort"]
            return number
    raise AssertionError(f"{c['name']} declares no port {port!r}")


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


QUANTITY = re.compile(r"^([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
SUFFIXES = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity(value: str | int | float) -> float:
    match = QUANTITY.match(str(value))
    assert match, f"not a Kubernetes quantity: {value!r}"
    return float(match[1]) * SUFFIXES[match[2]]


# --- the folder -----------------------------------------------------------------------------


def test_kustomization_lists_every_manifest_and_each_parses() -> None:
    listed = kustomization()["resources"]
    assert sorted(listed) == [p.name for p in manifest_files()], (
        "every manifest in deploy/kubernetes is applied by `kubectl apply -k`, and only those"
    )
    for obj in manifests():
        assert obj.get("apiVersion") and obj.get("kind") and obj["metadata"].get("name"), obj


def test_the_operators_secrets_have_examples_and_stay_out_of_git() -> None:
    for spec in kustomization()["secretGenerator"]:
        for path in [*spec.get("envs", []), *spec.get("files", [])]:
            assert example(path).is_file(), f"{path}: no committed example to copy"
            assert path.startswith("secrets/"), path
            ignored = subprocess.run(
                ["git", "-C", str(REPO), "check-ignore", "-q", str(HERE / path)], check=False
            )
            assert ignored.returncode == 0, f"{path} would be committed: .gitignore it"
    for spec in kustomization()["configMapGenerator"]:
        for path in spec.get("envs", []):
            assert (HERE / path).is_file(), path


def test_namespaced_objects_are_in_the_gateways_namespace() -> None:
    namespace = kustomization()["namespace"]
    assert the("Namespace")["metadata"]["name"] == namespace
    for obj in manifests():
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == namespace, obj["metadata"]["name"]


# --- the API's schemas ----------------------------------------------------------------------


def describe(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_against_the_kubernetes_api_schemas(version: str) -> None:
    failures = []
    for obj in everything():
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(part) for part in exc.path)
            failures.append(f"{describe(obj)}: {where}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:  # a kind the API lacks
            failures.append(f"{describe(obj)}: {exc.message}")
    assert not failures, "\n".join(failures)


def test_the_schemas_are_strict_enough_to_catch_a_misspelt_field() -> None:
    """The check above would pass anything if validation ignored unknown fields."""
    deployment = the("Deployment")
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 360
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


# --- what the schemas cannot say ------------------------------------------------------------


def test_probes_ask_the_gateways_health_route_on_the_port_it_listens_on() -> None:
    assert HEALTH in [route[0] for route in routes(None)]  # type: ignore[arg-type]  # only paths
    gateway = container(GATEWAY)
    listens = gateway_settings().port
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = gateway.get(kind)
        assert probe is not None, f"the gateway has no {kind}"
        assert probe["httpGet"]["path"] == HEALTH, kind
        assert port_number(gateway, probe["httpGet"]["port"]) == listens, kind
        # health waits up to STORE_PING_TIMEOUT for the store before it answers 503
        assert probe.get("timeoutSeconds", 1) > STORE_PING_TIMEOUT, kind
    # a liveness window shorter than a minute would restart every replica (losing their
    # runs) on a short outage of the store, which health reports as 503
    liveness = gateway["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60


def test_service_pdb_and_network_policy_select_the_deployments_pods() -> None:
    deployment = the("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert matches(deployment["spec"]["selector"]["matchLabels"], labels)
    service = the("Service")
    assert matches(service["spec"]["selector"], labels)
    gateway = container(GATEWAY)
    for port in service["spec"]["ports"]:
        assert port_number(gateway, port["targetPort"]) == gateway_settings().port
    pdb = the("PodDisruptionBudget")
    assert matches(pdb["spec"]["selector"]["matchLabels"], labels)
    assert pdb["spec"].get("maxUnavailable") == 1 or (
        pdb["spec"].get("minAvailable", 0) <= deployment["spec"]["replicas"] - 1
    )
    assert deployment["spec"]["replicas"] >= 2, "one replica is no fleet"
    policy = the("NetworkPolicy")
    assert matches(policy["spec"]["podSelector"]["matchLabels"], labels)


def test_the_network_policy_lets_in_http_only_and_out_dns_and_the_store() -> None:
    spec = the("NetworkPolicy")["spec"]
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}, "both directions denied by default"
    gateway = container(GATEWAY)
    for rule in spec["ingress"]:
        assert rule.get("ports"), "an ingress rule without ports opens every port"
        for port in rule["ports"]:
            assert port["protocol"] == "TCP"
            assert port_number(gateway, port["port"]) == gateway_settings().port
    store_port = re.search(r"@[^/:]+:(\d+)/", gateway_settings().store or "")
    assert store_port, "the example DSN names its port"
    allowed = {53, int(store_port[1]), 443}  # DNS, the store, the kernel image's registry
    out_ports = set()
    for rule in spec["egress"]:
        assert rule.get("to"), "an egress rule without `to` lets the pods reach anywhere"
        assert rule.get("ports"), "an egress rule without ports opens every port"
        for peer in rule["to"]:
            if "ipBlock" in peer:
                ipaddress.ip_network(peer["ipBlock"]["cidr"])
        out_ports |= {p["port"] for p in rule["ports"]}
    assert out_ports == allowed


def test_every_secret_and_config_map_named_exists_or_is_the_operators_optional_one() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index("\n## Deploy\n")
    deploy = readme[start : readme.find("\n## ", start + 1)]
    wanted: list[tuple[str, str, str | None, bool]] = []  # kind, name, key, optional
    for v in pod()["volumes"]:
        if "secret" in v:
            wanted.append(
                ("Secret", v["secret"]["secretName"], None, v["secret"].get("optional", False))
            )
            wanted += [
                ("Secret", v["secret"]["secretName"], i["key"], True)
                for i in v["secret"].get("items", [])
            ]
        if "configMap" in v:
            wanted.append(
                ("ConfigMap", v["configMap"]["name"], None, v["configMap"].get("optional", False))
            )
    for c in all_containers():
        for source in c.get("envFrom", []):
            for field, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
                if field in source:
                    ref = source[field]
                    wanted.append((kind, ref["name"], None, ref.get("optional", False)))
        for var in c.get("env", []):
            ref = var.get("valueFrom", {})
            for field, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
                if field in ref:
                    wanted.append(
                        (
                            kind,
                            ref[field]["name"],
                            ref[field]["key"],
                            ref[field].get("optional", False),
                        )
                    )
    assert wanted
    for kind, name, key, optional in wanted:
        obj = named(kind, name)
        if obj is None:
            assert optional, f"{kind} {name} is used but neither made here nor optional"
            assert f"`{name}`" in deploy, f"the operator's {kind} {name} is not in README's Deploy"
            continue
        if key is not None:
            assert key in obj["data"], f"{kind} {name} has no key {key}"
    account = pod()["serviceAccountName"]
    assert named("ServiceAccount", account) is not None
    assert pod()["automountServiceAccountToken"] is False, "the gateway does not call the API"


def test_the_gateways_environment_is_settings_the_gateway_accepts() -> None:
    env = environment(container(GATEWAY))
    fields = set(Settings.model_fields)
    for name in env:
        if name.startswith("GATEWAY_"):
            assert name[len("GATEWAY_") :].lower() in fields, f"{name} is no setting: ignored"
    settings = gateway_settings()  # raises on a value the gateway refuses
    assert settings.backend == "docker"
    assert settings.host == "0.0.0.0", "a replica must listen beyond its loopback"
    assert settings.store is not None and settings.store.startswith("postgresql://")
    assert settings.instance_id == A_POD_NAME
    assert pod().get("enableServiceLinks") is False, "FOO_PORT=tcp://... could shadow a setting"
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    command = container(GATEWAY)["command"]  # the package's console script, as installed
    assert command[0] in project["scripts"] and command[1:] == ["serve"], command


def test_the_token_files_are_the_secrets_mounted_read_only_and_the_gateway_reads_them(
    tmp_path: Path,
) -> None:
    settings = gateway_settings()
    gateway = container(GATEWAY)
    assert settings.tokens is not None and settings.metrics_token_file is not None
    copies = {}
    for path in (settings.tokens, settings.metrics_token_file):
        mount = mount_of(gateway, path)
        assert mount is not None and mount.get("readOnly") is True, f"{path}: not read-only"
        source = volume(mount["name"])["secret"]
        secret = named("Secret", source["secretName"])
        assert secret is not None
        key = str(path.relative_to(mount["mountPath"]))
        assert key in secret["data"], f"{path}: the Secret has no {key}"
        copies[path] = tmp_path / key
        copies[path].write_bytes(base64.b64decode(secret["data"][key]))
    table = TokenTable.load(copies[settings.tokens], copies[settings.metrics_token_file])
    assert table.multi_user


def test_what_the_gateway_writes_is_on_a_volume_it_shares_with_its_engine_where_needed() -> None:
    gateway, engine = container(GATEWAY), container(ENGINE)
    env = environment(gateway)
    settings = gateway_settings()
    assert gateway["securityContext"].get("readOnlyRootFilesystem") is True
    for path in (settings.data_dir, env["TMPDIR"], "/tmp", LEASE_DIR, *MACHINE_LOCK_FOLDERS):
        mount = mount_of(gateway, path)
        assert mount is not None and not mount.get("readOnly"), f"{path} is not writable"
    # the sandboxes' folder: the same path in both, the gateway's tmpfs mounts seen by the
    # engine that binds them into each kernel's container
    tmp = mount_of(gateway, env["TMPDIR"])
    assert tmp is not None and tmp["mountPath"] == env["TMPDIR"]
    assert tmp.get("mountPropagation") == "Bidirectional"
    (seen,) = [m for m in engine["volumeMounts"] if m["name"] == tmp["name"]]
    assert seen["mountPath"] == tmp["mountPath"]
    assert seen.get("mountPropagation") in ("HostToContainer", "Bidirectional")
    socket_dir = f"{env['TMPDIR']}/gw{'x' * 6}-{'x' * 8}/sock/s"  # docker.py's names
    assert len(socket_dir) + 2 <= SOCKET_PATH_MAX
    # uids are leased machine-wide: the node's folder, not the pod's
    leases = mount_of(gateway, LEASE_DIR)
    assert leases is not None and "hostPath" in volume(leases["name"])
    # the engine's API: one socket in a volume both mount at the same path
    host = env["DOCKER_HOST"]
    assert host.startswith("unix://")
    socket = Path(host.removeprefix("unix://"))
    for c in (gateway, engine, container(PULL)):
        mount = mount_of(c, socket)
        assert mount is not None and mount["mountPath"] == str(socket.parent), c["name"]
    assert f"--host={host}" in engine["args"]
    assert f"--host={host}" in container(PULL)["command"]


def test_the_engine_holds_the_kernels_and_outlives_the_drain() -> None:
    settings = gateway_settings()
    engine = container(ENGINE)
    assert engine in pod()["initContainers"] and engine.get("restartPolicy") == "Always", (
        "the engine must be a sidecar: started before the gateway, stopped after its drain"
    )
    args = engine["args"]
    assert args[0] == "dockerd", "else the image's entrypoint adds an open TCP port 2375"
    assert not any("tcp://" in a for a in args)
    assert "--bridge=none" in args and "--iptables=false" in args
    limits = engine["resources"]["limits"]
    assert quantity(limits["memory"]) >= settings.max_concurrent_runs * settings.memory_bytes
    assert quantity(limits["cpu"]) >= settings.max_concurrent_runs * settings.cpus
    # the kernel image: pulled after the engine starts, the very image the gateway names
    names = [c["name"] for c in pod()["initContainers"]]
    assert names.index(PULL) > names.index(ENGINE)
    pull = container(PULL)
    assert environment(pull)["KERNEL_IMAGE"] == settings.docker_image
    assert "$(KERNEL_IMAGE)" in pull["command"]


def test_the_grace_period_covers_the_drain() -> None:
    settings = gateway_settings()
    assert settings.drain_timeout >= settings.max_timeout, "a run started last can finish"
    pre_stop = container(GATEWAY)["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = pod()["terminationGracePeriodSeconds"]
    assert grace >= pre_stop + settings.drain_timeout + DRAIN_MARGIN


def test_what_the_api_server_would_refuse_though_the_schema_allows_it() -> None:
    names = [c["name"] for c in all_containers()]
    assert len(names) == len(set(names)), "container names are unique in a pod"
    volumes = {v["name"] for v in pod()["volumes"]}
    used = set()
    for c in all_containers():
        context = c.get("securityContext", {})
        privileged = context.get("privileged", False)
        assert not (privileged and context.get("allowPrivilegeEscalation") is False), c["name"]
        for mount in c.get("volumeMounts", []):
            assert mount["name"] in volumes, f"{c['name']}: no volume {mount['name']}"
            used.add(mount["name"])
            if mount.get("mountPropagation") == "Bidirectional":
                assert privileged, f"{c['name']}: Bidirectional propagation needs privileged"
        for port in c.get("ports", []):
            assert len(port.get("name", "")) <= 15, port
        resources = c.get("resources", {})
        for what, request in resources.get("requests", {}).items():
            limit = resources.get("limits", {}).get(what)
            if limit is not None:
                assert quantity(request) <= quantity(limit), f"{c['name']}: {what}"
        assert c["image"].split(":")[0] in {i["name"] for i in kustomization()["images"]}, (
            f"{c['name']}: its image is not renamed to the operator's registry"
        )
    assert used == volumes, f"volumes no container mounts: {volumes - used}"


# --- kustomize itself, where it is installed ------------------------------------------------


@pytest.fixture
def rendered(tmp_path: Path) -> Iterator[list[dict[str, Any]]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the rendering is not checked (the rest is)")
    folder = tmp_path / "kubernetes"
    shutil.copytree(HERE, folder)
    for spec in kustomization()["secretGenerator"]:
        for path in [*spec.get("envs", []), *spec.get("files", [])]:
            shutil.copy(example(path), folder / path)
    result = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    yield [d for d in yaml.safe_load_all(result.stdout) if d]


def test_kustomize_renders_objects_the_api_accepts(rendered: list[dict[str, Any]]) -> None:
    for obj in rendered:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    kinds = sorted(o["kind"] for o in rendered)
    assert kinds == sorted(o["kind"] for o in everything())
    deployment = the("Deployment", rendered)
    text = yaml.safe_dump(deployment)
    for obj in rendered:
        if obj["kind"] in ("ConfigMap", "Secret"):  # names with a hash, used under them
            assert obj["metadata"]["name"] in text, obj["metadata"]["name"]
    images = [c["image"] for c in all_containers()]
    for c in the("Deployment", rendered)["spec"]["template"]["spec"]["containers"]:
        assert c["image"] not in images, "kustomization.yaml's `images` renamed nothing"
