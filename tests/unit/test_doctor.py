"""`appliance doctor` and `appliance backends` on a CPU-only box."""

from __future__ import annotations

import json

import pytest

from appliance.cli import main as cli_main


def test_backends_json_names_what_is_missing(capsys) -> None:
    assert cli_main(["backends", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    cpu = report["engines"]["onnxruntime-cpu"]
    assert cpu["available"] is True and cpu["reason"] is None and "onnxruntime" in cpu["needs"]
    cuda = report["engines"]["onnxruntime-cuda"]
    assert not cuda["available"]
    assert "CUDAExecutionProvider" in cuda["reason"] or "cannot load" in cuda["reason"]
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
    from appliance.tools.doctor_gpu import EXIT_NO_GPU

    rc = cli_main(["doctor", "--gpu", "--json"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert rc == EXIT_NO_GPU == 3
    assert not checks["gpu"]["ok"] and checks["gpu"]["detail"].startswith("NO USABLE NVIDIA GPU on this machine: ")
    assert "no NVIDIA driver" in checks["gpu"]["detail"] or "cuda-bindings is not installed" in checks["gpu"]["detail"]
    assert not checks["nvml"]["ok"] and "no GPU" in checks["nvml"]["detail"]
    assert not checks["tensorrt import"]["ok"] and "pypi.nvidia.com" in checks["tensorrt import"]["detail"]
    env = checks["environment"]["data"]
    assert env["packages"]["edge-appliance"] and "python" in env
    assert not {"tensorrt w4a16", "tensorrt fp16", "end-to-end (daemon)"} & set(checks)  # nothing pretends to run


def test_doctor_gpu_text_says_no_gpu_and_the_exit_status(capsys) -> None:
    assert cli_main(["doctor", "--gpu"]) == 3
    out = capsys.readouterr().out
    assert "[FAIL] gpu: NO USABLE NVIDIA GPU" in out and "exit status 3" in out


@pytest.mark.parametrize("argv", [["doctor", "--thermal"]])
def test_doctor_thermal_without_gpu_fails_with_reason(capsys, argv) -> None:
    assert cli_main([*argv, "--json"]) == 1
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert "needs an NVIDIA GPU" in checks["thermal commissioning"]["detail"]


def test_doctor_reports_the_strict_jpeg_check_and_names_the_package_when_missing(monkeypatch) -> None:
    import sys

    from appliance.tools.doctor import check_backends

    present = {c.name: c for c in check_backends()}["strict JPEG check"]
    assert present.ok and present.detail.startswith("simplejpeg ")
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # import fails as if not installed
    missing = {c.name: c for c in check_backends()}["strict JPEG check"]
    assert not missing.ok and "pip install 'simplejpeg>=1.8'" in missing.detail


def test_doctor_refuses_what_serve_would_refuse(tmp_path, capsys) -> None:
    """Ops review, session 14: doctor exited 0 for an unwritable cache directory, a missing GPU backend and an
    unknown default pipeline, all of which serve refuses (operations.md says to run doctor before a restart), and
    printed a traceback for a config key serve names in one line."""
    bad_key = tmp_path / "bad_key.toml"
    bad_key.write_text("[engine]\nbogus = 1\n")
    assert cli_main(["doctor", "--config", str(bad_key)]) == 78
    out = capsys.readouterr().out
    assert out.strip().splitlines() == [out.strip()] and "config key engine.bogus" in out
    (tmp_path / "a_file").write_text("")
    cases = {
        "start-up checks": f'[engine]\ncache_dir = "{tmp_path / "a_file" / "cache"}"\n',
        "configured backend": '[engine]\nbackend = "onnxruntime-cuda"\n',
        "pipelines": '[model]\ndefault_pipeline = "no-such-pipeline"\n',
        # ops review, session 18: doctor passed these three, which serve refuses (exit 78), and crashed on the first
        "model configuration": '[model]\nprecision = "int8"\n',
        "model configuration ": "[batcher]\nqueue_capacity = 4\n",
        "start-up checks ": '[server]\nsocket_group = "no-such-group-here"\n',
    }
    for name, text in cases.items():
        cfg = tmp_path / "cfg.toml"
        cfg.write_text(text)
        assert cli_main(["doctor", "--config", str(cfg), "--json"]) == 1, name
        checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
        assert not checks[name.strip()]["ok"], (name, checks[name.strip()])
        assert "config key" in checks[name.strip()]["detail"] or name.strip() != "model configuration", checks
