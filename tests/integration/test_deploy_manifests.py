"""deploy/: the KServe ServingRuntime and InferenceService and the Envoy front parse and agree with each other and
with the appliance (its CLI flags, its config, its health service name).

No KServe CRD or Envoy schema is available offline, so these are structural checks on the parsed YAML plus the
appliance's own parsers (the container args through `appliance serve`'s argument parser, the ConfigMap's
appliance.toml through load_config).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from appliance.cli import _parser
from appliance.config import load_config
from appliance.serving.health import INFERENCE_SERVICE
from tests.support import REPO

DEPLOY = REPO / "deploy"


def docs(path: Path) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(path.read_text()) if d}


@pytest.fixture(scope="module")
def runtime() -> dict[str, dict[str, Any]]:
    return docs(DEPLOY / "kserve" / "servingruntime.yaml")


@pytest.fixture(scope="module")
def isvc() -> dict[str, Any]:
    return docs(DEPLOY / "kserve" / "inferenceservice.yaml")["InferenceService"]


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def test_serving_runtime_speaks_grpc_v2_on_the_port_it_probes(runtime: dict[str, dict[str, Any]]) -> None:
    rt = runtime["ServingRuntime"]
    assert rt["apiVersion"] == "serving.kserve.io/v1alpha1"
    spec = rt["spec"]
    assert spec["protocolVersions"] == ["grpc-v2"]
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"
    args = _parser().parse_args(container["args"])  # every flag exists on `appliance serve`
    assert args.command == "serve"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert [_port(a) for a in args.listen] == [ports["h2c"]]
    assert _port(args.metrics_listen) == ports["metrics"] == int(spec["annotations"]["prometheus.kserve.io/port"])
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["grpc"] == {"port": ports["h2c"], "service": INFERENCE_SERVICE}, probe
    assert container["livenessProbe"]["tcpSocket"]["port"] == ports["h2c"]  # never restart on a thermal pause
    mount = next(m for m in container["volumeMounts"] if m["name"] == "appliance-config")
    assert str(args.config).startswith(mount["mountPath"] + "/")


def test_configmap_is_a_valid_appliance_config(runtime: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    text = runtime["ConfigMap"]["data"]["appliance.toml"]
    (tmp_path / "appliance.toml").write_text(text)
    config = load_config(tmp_path / "appliance.toml")
    assert config.model.models_dir == "/mnt/models"  # where KServe mounts storageUri
    assert _port(config.metrics.listen) == 9400
    volume = next(v for v in runtime["ServingRuntime"]["spec"]["volumes"] if v["name"] == "appliance-config")
    assert volume["configMap"]["name"] == runtime["ConfigMap"]["metadata"]["name"]


def test_inference_service_uses_the_runtime(
    runtime: dict[str, dict[str, Any]], isvc: dict[str, Any], tmp_path: Path
) -> None:
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    spec = runtime["ServingRuntime"]["spec"]
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["ServingRuntime"]["metadata"]["name"]
    assert model["protocolVersion"] in spec["protocolVersions"]
    formats = {(f["name"], f["version"]) for f in spec["supportedModelFormats"]}
    assert (model["modelFormat"]["name"], model["modelFormat"]["version"]) in formats
    assert isvc["metadata"]["name"] == "ct-nodule"  # OIP model name = the manifest's name
    (tmp_path / "a.toml").write_text(runtime["ConfigMap"]["data"]["appliance.toml"])
    grace = load_config(tmp_path / "a.toml").server.grace_s
    assert isvc["spec"]["predictor"]["terminationGracePeriodSeconds"] > grace  # drain finishes before SIGKILL
    assert isvc["spec"]["predictor"]["minReplicas"] >= 2


def test_envoy_balances_per_request_and_health_checks_grpc() -> None:
    config = yaml.safe_load((DEPLOY / "envoy" / "envoy.yaml").read_text())
    (cluster,) = config["static_resources"]["clusters"]
    assert cluster["lb_policy"] == "LEAST_REQUEST"
    options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert "http2_protocol_options" in options["explicit_http_config"]
    (check,) = cluster["health_checks"]
    assert check["grpc_health_check"]["service_name"] == INFERENCE_SERVICE
    (listener,) = config["static_resources"]["listeners"]
    route = listener["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0]
    assert route["route"]["cluster"] == cluster["name"]
    assert set(route["route"]["retry_policy"]["retry_on"].split(",")) == {"unavailable", "resource-exhausted"}
