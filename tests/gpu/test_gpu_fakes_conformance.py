"""The GPU fakes against the real libraries: names in the real TensorRT bindings, real cuda.bindings signatures.

* TensorRT: the real ``tensorrt-cu13-bindings`` wheels (10.x: must pass; 11.x: forward-compatibility report)
  are fetched with ``pip download`` (skipped, with the reason, if the index is unreachable) and the names
  their ``tensorrt.so`` carries are read without importing it (tests/trt_names.py). Every ``trt.X.Y`` chain
  the backend uses and every public name of the fake must be there.
* CUDA runtime: every function of the fake has the real ``cuda.bindings.runtime`` signature (``inspect``),
  and the real binding's "no driver" answer is what :func:`probe_device` turns into its reason.
"""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
from trt_names import names_in_wheel

from appliance.engines import fake_cudart, fake_tensorrt
from appliance.engines.cuda import probe_device

REPO = Path(__file__).resolve().parents[2]
BACKEND_FILES = [REPO / "appliance" / "engines" / "tensorrt.py", REPO / "appliance" / "engines" / "trt_build.py"]
WHEEL_CACHE = Path(os.environ.get("APPLIANCE_TEST_CACHE", Path.home() / ".cache" / "edge-appliance-tests")) / "trt"

# What TensorRT 11 removed that this backend would notice; the backend uses none of it.
REMOVED_IN_11 = {"EXPLICIT_BATCH", "FP16", "int8_calibrator", "device_memory_size"}


def _wheel(spec: str) -> Path:
    """The newest cached tensorrt-cu13-bindings wheel matching ``spec`` (else the newest one, downloaded)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    wanted = SpecifierSet(spec)
    cached = [(Version(w.name.split("-")[1]), w) for w in WHEEL_CACHE.glob("tensorrt_cu13_bindings-*.whl")]
    matching = sorted((v, w) for v, w in cached if v in wanted)
    if matching:
        return matching[-1][1]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d",
           str(WHEEL_CACHE), f"tensorrt-cu13-bindings{spec}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.skip("pip download of tensorrt-cu13-bindings timed out (package index unreachable?)")
    if proc.returncode != 0:
        pytest.skip(f"cannot download tensorrt-cu13-bindings{spec}: {proc.stderr.strip()[-300:]}")
    return _wheel(spec)


def backend_trt_names() -> set[str]:
    """Every attribute chain component used as ``trt.X.Y...`` in the backend's source."""
    used: set[str] = set()
    for path in BACKEND_FILES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                chain, cur = [], node
                while isinstance(cur, ast.Attribute):
                    chain.append(cur.attr)
                    cur = cur.value
                if isinstance(cur, ast.Name) and cur.id == "trt":
                    used.update(c for c in chain if not c.startswith("__"))  # __version__ is the package's
    return used


def fake_trt_names() -> set[str]:
    """Public names of the fake module and the public methods/properties of its classes."""
    names: set[str] = set()
    for name in fake_tensorrt.__all__:
        if name in ("STATE", "reset"):
            continue
        names.add(name)
        obj = getattr(fake_tensorrt, name)
        if inspect.isclass(obj):
            names.update(k for k in vars(obj) if not k.startswith("_"))
    for cls in (fake_tensorrt._Network, fake_tensorrt._Config, fake_tensorrt._Engine, fake_tensorrt._Inspector,
                fake_tensorrt._Context, fake_tensorrt._TimingCache):
        names.update(k for k in vars(cls) if not k.startswith("_") and k not in ("session", "facts", "onnx"))
    names.update({"builder_optimization_level", "hardware_compatibility_level", "profiling_verbosity",
                  "progress_monitor"})  # properties set on the config
    return names - {"strongly_typed", "pools", "flags", "timing_cache", "errors", "network", "logger", "engine",
                    "addresses", "io", "min_severity", "data"}


def test_backend_uses_trt_names() -> None:
    used = backend_trt_names()
    assert {"Builder", "OnnxParser", "Runtime", "NetworkDefinitionCreationFlag", "STRONGLY_TYPED",
            "IProgressMonitor", "MemoryPoolType", "WORKSPACE", "ProfilingVerbosity", "DETAILED"} <= used
    assert not used & REMOVED_IN_11, "the backend must not use APIs TensorRT 11 removed"
    assert "BuilderFlag" not in used or used & {"FP16", "INT8", "INT4", "BF16"} == set()


@pytest.mark.parametrize("spec", [">=10.13,<10.14", ">=10.14,<11"], ids=["pin floor", "newest 10.x"])
def test_real_tensorrt_10_has_every_name_the_backend_and_fake_use(spec: str) -> None:
    """The pin's floor and its newest release: only the newest was ever fetched, and at 10.13 ``__version__`` (the
    Python package's, not the bindings') was reported missing (GPU code review, session 19)."""
    names = names_in_wheel(_wheel(spec))
    assert "NoSuchAttributeInTensorRT" not in names  # the reader is not "everything matches"
    missing_backend = sorted(backend_trt_names() - names)
    missing_fake = sorted(fake_trt_names() - names)
    assert not missing_backend, f"backend uses tensorrt names the real 10.x bindings lack: {missing_backend}"
    assert not missing_fake, f"the fake tensorrt has names the real 10.x bindings lack: {missing_fake}"


def test_real_tensorrt_11_forward_compatibility_report() -> None:
    names = names_in_wheel(_wheel(">=11,<12"))
    assert REMOVED_IN_11 - names == REMOVED_IN_11, "the reader must see what 11 removed"
    missing = sorted((backend_trt_names() | fake_trt_names()) - names)
    # Forward compatibility: nothing the backend or fake uses is gone in 11 (STRONGLY_TYPED is kept, ignored).
    assert not missing, f"TensorRT 11 lacks names the backend/fake use: {missing}"


def _cudart():
    return pytest.importorskip("cuda.bindings.runtime", reason="cuda-bindings not installed (the [gpu] extra)")


def test_fake_cudart_functions_have_the_real_signatures() -> None:
    real = _cudart()
    checked = 0
    for name in fake_cudart.__all__:
        fake = getattr(fake_cudart, name)
        if not (name.startswith("cuda") and inspect.isfunction(fake)):
            continue
        assert hasattr(real, name), f"cuda.bindings.runtime has no {name}"
        want = inspect.signature(getattr(real, name))
        got = inspect.signature(fake).replace(return_annotation=inspect.Signature.empty)
        assert str(got) == str(want), f"{name}: fake {got} != real {want}"
        checked += 1
    assert checked >= 25
    for enum_name in ("cudaError_t", "cudaMemcpyKind", "cudaStreamCaptureMode"):
        real_enum, fake_enum = getattr(real, enum_name), getattr(fake_cudart, enum_name)
        for member in fake_enum:
            assert int(getattr(real_enum, member.name)) == int(member), f"{enum_name}.{member.name}"


def test_real_cuda_bindings_without_driver_gives_the_no_driver_reason() -> None:
    real = _cudart()
    err, count = real.cudaGetDeviceCount()
    if err == real.cudaError_t.cudaSuccess and count:
        pytest.skip("this machine has a CUDA GPU and driver")
    info = probe_device(real)
    assert not info.ok
    if err == real.cudaError_t.cudaErrorInsufficientDriver:
        assert "no NVIDIA driver" in info.reason and "cudaErrorInsufficientDriver" in info.reason
        assert info.driver_version == 0
    else:
        assert "no CUDA GPU" in info.reason


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"driver": False}, "no NVIDIA driver"),
    ({"devices": 0}, "no CUDA GPU"),
])
def test_fake_cudart_reasons_match_the_real_error_codes(kwargs: dict, words: str) -> None:
    fake_cudart.reset(**kwargs)
    try:
        info = probe_device(fake_cudart)
    finally:
        fake_cudart.reset()
    assert not info.ok and words in info.reason
