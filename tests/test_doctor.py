"""`appliance doctor` and `appliance backends` on a CPU-only box."""

from __future__ import annotations

import json

import pytest

from appliance.cli import main as cli_main


def test_backends_json_names_what_is_missing(capsys) -> None:
    assert cli_main(["backends", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["engines"]["onnxruntime-cpu"] is None
    assert "CUDAExecutionProvider" in report["engines"]["onnxruntime-cuda"]
    assert all(info["available"] for info in report["decoders"].values())


def test_doctor_thermal_sim_commissions_the_simulated_plant(capsys) -> None:
    rc = cli_main(["doctor", "--thermal", "--sim", "--quick", "--json"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    sim = checks["thermal commissioning (simulated)"]
    assert sim["ok"], sim["detail"]
    assert 0 < sim["data"]["blind_duty"]["blind_duty"] <= 1
    assert checks["thermometer"]["ok"]
    assert rc in (0, 1)  # 1 only if another check (e.g. a missing GPU backend) failed


def test_doctor_gpu_says_plainly_there_is_no_gpu(capsys) -> None:
    rc = cli_main(["doctor", "--gpu", "--json"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert rc == 1
    assert not checks["nvml"]["ok"] and "no GPU" in checks["nvml"]["detail"]
    assert not checks["engine onnxruntime-cuda"]["ok"]
    assert "no TensorRT backend" in checks["tensorrt"]["detail"]


@pytest.mark.parametrize("argv", [["doctor", "--thermal"]])
def test_doctor_thermal_without_gpu_fails_with_reason(capsys, argv) -> None:
    assert cli_main([*argv, "--json"]) == 1
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert "needs an NVIDIA GPU" in checks["thermal commissioning"]["detail"]
