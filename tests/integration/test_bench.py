"""`appliance bench`: the JSON report's schema, against the fake engine (behaviour, never speed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from appliance.serving.notify import RecordingNotifier
from appliance.tools.bench import main as bench_main
from tests.support import REPO, RunningApp, fake_config

KEYS = {"throughput_per_s", "latency_ms", "stages_ms", "batch_fill", "errors"}


def test_bench_against_a_running_daemon(models_dir: Path, tmp_path: Path) -> None:
    app = RunningApp(fake_config(models_dir), notifier=RecordingNotifier())
    try:
        out = tmp_path / "bench.json"
        rc = bench_main(
            [
                "--target",
                app.target,
                "--requests",
                "24",
                "--files",
                "6",
                "--concurrency",
                "4",
                "--workload",
                "mixed",
                "--json",
                str(out),
            ]
        )
    finally:
        app.stop()
    report = json.loads(out.read_text())
    assert rc == 0
    assert KEYS <= set(report)
    assert set(report["latency_ms"]) == {"p50", "p90", "p99", "max"}
    assert {"preprocess_per_item", "engine_per_batch"} <= set(report["stages_ms"])
    assert report["requests"] == 24 and report["errors"] == {}
    assert 0 < report["batch_fill"] <= 1
    assert "sequential_throughput_per_s" not in report  # --target skips the comparison


def test_bench_starts_daemons_and_compares_with_sequential(models_dir: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "fake.toml"
    cfg.write_text(
        f'[model]\nmodels_dir = "{models_dir}"\npipelines_dir = "{REPO / "pipelines"}"\n'
        '[engine]\nbackend = "fake"\nwarmup_runs = 1\n[thermal]\nsensor = "none"\n'
    )
    out = tmp_path / "bench.json"
    rc = bench_main(
        [
            "--requests",
            "16",
            "--files",
            "4",
            "--concurrency",
            "4",
            "--warmup",
            "4",
            "--workload",
            "native",
            "--json",
            str(out),
            "--",
            "--config",
            str(cfg),
        ]
    )
    report = json.loads(out.read_text())
    assert rc == 0, report
    assert KEYS <= set(report)
    assert report["sequential_throughput_per_s"] > 0
    assert report["speedup_vs_sequential"] == pytest.approx(
        report["throughput_per_s"] / report["sequential_throughput_per_s"], rel=1e-2
    )
    assert report["server"]["backend"] == "fake"
