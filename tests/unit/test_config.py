"""Config: defaults are the embedded default; errors name the key; unknown keys are errors."""

from __future__ import annotations

import os
import re
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.config import load_config
from appliance.errors import ConfigError


def test_defaults_are_the_embedded_default() -> None:
    cfg = load_config()
    assert cfg.engine.backend == "auto"
    assert cfg.model.name == "ct-nodule"
    assert "127.0.0.1:50051" in cfg.server.listen
    assert any(a.startswith("unix:") for a in cfg.server.listen)
    assert cfg.server.max_message_bytes == 64 << 20
    assert cfg.thermal.sensor == "auto"
    assert (cfg.models_dir() / "ct-nodule").is_dir()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[batcher]\nmax_wiat_s = 1\n", "batcher.max_wiat_s"),
        ("[engine]\nintra_op_threads = 'two'\n", "engine.intra_op_threads"),
        ("[servre]\n", "[servre]"),
        ("[batcher]\nqueue_capacity = 0\n", "batcher.queue_capacity"),
        ("[thermal]\nsensor = 'ir-camera'\n", "thermal.sensor"),
        ("[server]\nlisten = '127.0.0.1:1'\n", "server.listen"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "appliance.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        load_config(path)


def test_example_config_loads() -> None:
    example = Path(__file__).resolve().parents[2] / "systemd" / "appliance.toml.example"
    cfg = load_config(example)
    assert cfg.server.grace_s > 0


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.toml"):
        load_config(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[server]\ndefault_deadline_s = '5'\n", "server.default_deadline_s"),
        ("[batcher]\nmax_wait_s = true\n", "batcher.max_wait_s"),
        ("[server]\ngrace_s = nan\n", "server.grace_s"),
        ("[server]\ndefault_deadline_s = -1.0\n", "server.default_deadline_s"),
    ],
)
def test_numbers_must_be_numbers(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "appliance.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=key):
        load_config(path)


def _scalar_keys(obj: object, prefix: str = "") -> dict[str, object]:
    """Every key of the config's schema tables (nested ones included) with its value."""
    import msgspec

    from appliance.schema import Schema

    keys: dict[str, object] = {}
    for f in msgspec.structs.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, Schema) and f.name != "options":
            keys.update(_scalar_keys(value, f"{prefix}{f.encode_name}."))
        else:
            keys[f"{prefix}{f.encode_name}"] = value
    return keys


def test_every_numeric_key_has_a_documented_range() -> None:
    from appliance.config import RANGES, Config

    docs = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    keys = _scalar_keys(Config())
    for key, value in keys.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            assert key in RANGES, f"{key} has no range in appliance.config.RANGES"
            assert f"`{key}`" in docs, f"{key} is not in docs/operations.md's range table"
    for key, (lo, hi) in RANGES.items():
        assert lo <= keys[key] <= hi, key  # type: ignore[operator]
    assert "thermal.sim.ambient_c" in RANGES and "server.inflight_bytes" in RANGES


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("dicom", "max_decoded_bytes", -1),
        ("dicom", "max_pixels_per_frame", 0),
        ("server", "max_message_bytes", 1 << 31),
        ("batcher", "preprocess_workers", 100000),
        ("batcher", "max_wait_s", 1e9),
        ("server", "grace_s", 60.0),
        ("metrics", "listen", "127.0.0.1:99999"),
        ("server", "listen", ["127.0.0.1:99999"]),
        ("server", "listen", ["10.0.0.5:50051"]),
        ("access", "loopback", "everyone"),
        ("logging", "level", "verbose"),
    ],
)
def test_out_of_range_values_name_the_key(section: str, key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"{section}.{key}"):
        load_config(None, {section: {key: value}})


def test_unknown_engine_option_is_refused_for_the_selected_backend() -> None:
    from appliance.engines.fake import FakeOptions

    cfg = load_config(None, {"engine": {"backend": "fake", "options": {"latency_s": 0.01}}})
    assert cfg.engine.options == FakeOptions(latency_s=0.01)
    with pytest.raises(ConfigError, match="engine.options.latency: .*'fake' .*known: dead_after, fail_batches"):
        load_config(None, {"engine": {"backend": "fake", "options": {"latency": 0.01}}})
    with pytest.raises(ConfigError, match="engine.options.latency_s: .*'onnxruntime-cpu' .*known: none"):
        load_config(None, {"engine": {"backend": "onnxruntime-cpu", "options": {"latency_s": 0.01}}})


# ------------------------------------------------------------------------------------------------------
# the schema loader: every error names the full key path


def _load_text(tmp_path: Path, text: str) -> object:
    path = tmp_path / "appliance.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour = 1\n", "config key colour: unknown key (known: access, batcher, dicom, engine, logging, metrics, "
                         "model, server, thermal, tls, workers)"),
        ("[servre]\nlisten = []\n", "config key servre: unknown table [servre] (known: access, batcher,"),
        ("[server]\nlisen = []\n", "config key server.lisen: unknown key (known: default_deadline_s, grace_s,"),
        ("[thermal.governor]\nlimt_c = 70.0\n", "config key thermal.governor.limt_c: unknown key (known: blind_duty,"),
        ("[thermal.governor.extra]\na = 1\n", "config key thermal.governor.extra: unknown table "
                                              "[thermal.governor.extra] (known: blind_duty,"),
        ("[thermal.sim]\nplnat = '4090'\n", "config key thermal.sim.plnat: unknown key (known: ambient_c, delay_s, "
                                            "noise_c, plant, quantize)"),
        ("[engine]\nbackend = 'fake'\n[engine.options]\nlatency = 1\n",
         "config key engine.options.latency: unknown option for backend 'fake' (known: dead_after, fail_batches, "
         "hang_after, latency_s)"),
        ("[engine]\nbackend = 'triton'\n[engine.options]\nurl = 'h:1'\nlatency_s = 1\n",
         "config key engine.options.latency_s: unknown option for backend 'triton' (known: load_timeout_s, "
         "model_name, model_version, timeout_s, url)"),
    ],
)
def test_unknown_keys_name_the_full_path_at_every_level(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load_text(tmp_path, text)
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("server = 3\n", "config key server: expected table, got int 3"),
        ("[server]\nmax_message_bytes = '64'\n", "config key server.max_message_bytes: expected int, got str '64'"),
        ("[server]\nlisten = ['127.0.0.1:1', 2]\n", "config key server.listen[1]: expected str, got int 2"),
        ("[server]\nreflection = 'yes'\n", "config key server.reflection: expected bool | null, got str 'yes'"),
        ("[batcher]\noverlap = 1\n", "config key batcher.overlap: expected bool, got int 1"),
        ("[workers]\nnice = 1.5\n", "config key workers.nice: expected int, got float 1.5"),
        ("[thermal]\nsim = 'fast'\n", "config key thermal.sim: expected table, got str 'fast'"),
        ("[thermal.governor]\nrecover_samples = 2.5\n",
         "config key thermal.governor.recover_samples: expected int, got float 2.5"),
        ("[thermal.sim]\nambient_c = 'warm'\n", "config key thermal.sim.ambient_c: expected float, got str 'warm'"),
        ("[engine]\nbackend = 'fake'\noptions = 3\n", "config key engine.options: expected table, got int 3"),
        ("[engine]\nbackend = 'fake'\n[engine.options]\nfail_batches = [1, 'x']\n",
         "config key engine.options.fail_batches[1]: expected int, got str 'x'"),
        ("[engine]\nbackend = 'triton'\n[engine.options]\nurl = 8001\n",
         "config key engine.options.url: expected str, got int 8001"),
        ("[logging]\nlevel = 'loud'\n",
         "config key logging.level: expected one of 'debug', 'error', 'info', 'warning', got 'loud'"),
        ("[thermal.sim]\nplant = '3090'\n",
         "config key thermal.sim.plant: expected one of '4090', '5090', 'pro6000maxq', got '3090'"),
        ("[thermal.sim]\nquantize = 'ceil'\n",
         "config key thermal.sim.quantize: expected one of 'floor', 'round', got 'ceil'"),
    ],
)
def test_wrong_types_name_the_path_and_the_types(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load_text(tmp_path, text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[server]\ninflight_bytes = 12\n",
         "config key server.inflight_bytes: expected int >= 1024, got 12 (range 1024 .. 1099511627776)"),
        ("[server]\ngrace_s = 60.0\n", "config key server.grace_s: expected float <= 20.0, got 60.0 (range 0 .. 20)"),
        ("[server]\ngrace_s = inf\n", "config key server.grace_s: expected float <= 20.0, got inf (range 0 .. 20)"),
        ("[thermal.sim]\nnoise_c = -1\n",
         "config key thermal.sim.noise_c: expected float >= 0.0, got -1 (range 0 .. 10)"),
        ("[engine]\nbackend = 'fake'\n[engine.options]\nlatency_s = -0.5\n",
         "config key engine.options.latency_s: expected float >= 0.0, got -0.5 (range 0 .. 3600)"),
        ("[engine]\nbackend = 'tensorrt'\n[engine.options]\noptimization_level = 9\n",
         "config key engine.options.optimization_level: expected int <= 5, got 9 (range 0 .. 5)"),
        ("[thermal.governor]\nlimit_c = -5.0\n",
         "config key thermal.governor.limit_c: must be a positive finite number, got -5.0"),
        ("[thermal.governor]\nmin_duty = 0.9\n", "config key thermal.governor.blind_duty: must be >= min_duty"),
    ],
)
def test_out_of_range_names_the_path_and_the_range(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load_text(tmp_path, text)
    assert str(info.value) == message


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_range_is_enforced_at_both_ends(data: st.DataObject) -> None:
    from appliance.config import RANGES

    key = data.draw(st.sampled_from(sorted(RANGES)))
    lo, hi = RANGES[key]
    *sections, name = key.split(".")
    is_int = isinstance(lo, int) and isinstance(hi, int)
    inside = data.draw(st.integers(int(lo), int(hi)) if is_int else st.floats(lo, hi))
    outside = data.draw(st.sampled_from([lo - 1, hi + 1] if is_int else [lo - 1.0, hi * 2 + 1.0]))

    def overrides(value: object) -> dict[str, dict[str, object]]:
        table: dict[str, object] = {name: value}
        for inner in reversed(sections[1:]):
            table = {inner: table}
        extra = {"server.max_message_bytes": {"inflight_bytes": 1 << 40},
                 "server.inflight_bytes": {"max_message_bytes": 1024}}.get(key, {})
        return {sections[0]: {**table, **extra}}

    cfg = load_config(None, overrides(inside))
    obj: object = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    assert obj == inside
    with pytest.raises(ConfigError, match=rf"^config key {re.escape(key)}: expected .* \(range "):
        load_config(None, overrides(outside))


def test_engine_options_are_typed_per_backend() -> None:
    from appliance.engines.fake import FakeOptions
    from appliance.engines.onnxruntime import OrtCudaOptions
    from appliance.engines.tensorrt import TensorrtOptions
    from appliance.engines.triton import TritonOptions

    fake = load_config(None, {"engine": {"backend": "fake", "options": {"latency_s": 1, "fail_batches": [2, 3]}}})
    assert fake.engine.options == FakeOptions(latency_s=1.0, fail_batches=(2, 3))
    assert isinstance(fake.engine.options.latency_s, float)  # type: ignore[attr-defined]
    assert fake.engine.options.as_dict() == {"latency_s": 1.0, "fail_batches": (2, 3)}  # unset optional ones out
    triton = load_config(None, {"engine": {"backend": "triton", "options": {"url": "h:8001"}}}).engine.options
    assert triton == TritonOptions(url="h:8001")
    trt = load_config(None, {"engine": {"backend": "tensorrt", "options": {"precision": "fp16"}}}).engine.options
    assert trt == TensorrtOptions(precision="fp16")
    cuda = load_config(None, {"engine": {"backend": "onnxruntime-cuda", "options": {"gpu_mem_limit": 1 << 30}}})
    assert cuda.engine.options == OrtCudaOptions(gpu_mem_limit=1 << 30)
    # auto may pick any backend of AUTO_ORDER: it takes the options of all of them, and no others
    auto = load_config(None, {"engine": {"options": {"precision": "fp16", "device_id": 1}}}).engine.options
    assert (auto.precision, auto.device_id) == ("fp16", 1)  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="engine.options.url: unknown option for backend 'auto'"):
        load_config(None, {"engine": {"options": {"url": "h:1"}}})
    with pytest.raises(ConfigError, match="config key engine.backend: unknown backend 'fast'"):
        load_config(None, {"engine": {"backend": "fast"}})


@pytest.mark.parametrize("backend", ["fake", "triton"])
def test_engine_option_defaults_are_the_engines_own(backend: str, tmp_path: Path) -> None:
    """Config passes every option to the engine: its schema defaults must be what the engine assumes unset."""
    from dicom_testkit import write_manifest

    from appliance.engines import declared_options, resolve
    from appliance.manifest import load_manifest

    manifest = load_manifest(write_manifest(tmp_path / "models"))
    cls = resolve(backend)[0]
    bare = cls(manifest, manifest.artifact(), {})
    configured = cls(manifest, manifest.artifact(), declared_options(backend)().as_dict())
    attrs = {k: v for k, v in vars(bare).items() if isinstance(v, int | float | str | set | type(None))}
    assert attrs == {k: vars(configured)[k] for k in attrs}


def test_thermal_sections_are_typed(tmp_path: Path) -> None:
    from appliance.thermal.governor import ThermalConfig
    from appliance.thermal.plant import PRESETS, SensorParams

    cfg = _load_text(tmp_path, "[thermal]\nsensor = 'sim'\n[thermal.governor]\nlimit_c = 80\nemergency_c = 82.0\n"
                               "[thermal.sim]\nplant = '4090'\nambient_c = 35\ndelay_s = 2.0\nquantize = 'round'\n")
    thermal = cfg.thermal  # type: ignore[attr-defined]
    assert thermal.governor == ThermalConfig(limit_c=80.0, emergency_c=82.0)
    assert thermal.sim.plant == "4090" and thermal.sim.ambient_c == 35.0
    assert thermal.sim.sensor_params() == SensorParams(delay_s=2.0, quantize="round", noise_c=SensorParams.noise_c)
    assert load_config().thermal.sim.sensor_params() == SensorParams()  # defaults are the simulator's
    from typing import get_args, get_type_hints

    from appliance.config import ThermalSimSection

    assert set(get_args(get_type_hints(ThermalSimSection)["plant"])) == set(PRESETS)  # the choices are the presets


def test_build_thermal_uses_the_typed_sim_table(tmp_path: Path) -> None:
    from appliance.clock import ManualClock
    from appliance.serving.app import build_thermal

    cfg = load_config(None, {"thermal": {"sensor": "sim", "sim": {"plant": "4090", "ambient_c": 30.0,
                                                                  "delay_s": 2.0, "noise_c": 0.0}}})
    controller = build_thermal(cfg.thermal, ManualClock(), lambda: 0.0)
    therm = controller.thermometer
    assert therm.plant.params.name == "4090"  # type: ignore[attr-defined]
    assert therm.ambient_c == 30.0  # type: ignore[attr-defined]
    assert therm.sensor.params.delay_s == 2.0  # type: ignore[attr-defined]
    assert controller.governor.config == cfg.thermal.governor


def test_the_thermal_memory_lives_in_the_state_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from appliance.clock import ManualClock
    from appliance.serving.app import build_thermal

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))  # StateDirectory= in the unit
    cfg = load_config(None, {"thermal": {"sensor": "sim"}})
    controller = build_thermal(cfg.thermal, ManualClock(), lambda: 0.0)
    assert controller.memory is not None and controller.memory.path == tmp_path / "thermal-memory-gpu0.json"
    chosen = load_config(None, {"thermal": {"sensor": "sim", "state_file": str(tmp_path / "t.json")}})
    assert build_thermal(chosen.thermal, ManualClock(), lambda: 0.0).memory.path == tmp_path / "t.json"  # type: ignore[union-attr]
    monkeypatch.delenv("STATE_DIRECTORY")
    assert build_thermal(cfg.thermal, ManualClock(), lambda: 0.0).memory.path is None  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="config key thermal.state_file: must be an absolute path"):
        load_config(None, {"thermal": {"state_file": "thermal.json"}})


@pytest.mark.parametrize(("sensor", "gpu", "warned"), [("auto", True, "thermal governor blind"), ("auto", False, None)])
def test_a_missing_sensor_is_a_warning_when_a_gpu_needs_it(sensor: str, gpu: bool, warned: str | None,
                                                           caplog) -> None:
    """Ops review, session 14: a GPU engine without a sensor logged INFO only. On a CPU box with "auto", no sensor
    is expected and stays INFO."""
    from appliance.clock import ManualClock
    from appliance.serving.app import build_thermal
    from appliance.thermal.fake_pynvml import FakePynvml

    cfg = load_config(None, {"thermal": {"sensor": sensor}})
    fake = FakePynvml(device_count=0)
    with caplog.at_level("INFO"), mock.patch("appliance.thermal.nvml.pynvml", fake):
        controller = build_thermal(cfg.thermal, ManualClock(), lambda: 0.0, gpu_engine=gpu)
    assert not controller.enabled
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    if warned is None:
        assert not warnings and "thermal governor disabled" in caplog.text
    else:
        assert any(warned in w for w in warnings), caplog.text


@pytest.mark.parametrize("gpu", [False, True])
def test_nvml_asked_for_by_name_without_a_reading_refuses_to_start(gpu: bool) -> None:
    """Held-out review, session 18: ``thermal.sensor = "nvml"`` with no NVML was a WARNING, and the daemon reported
    SERVING with no temperature watched. Now it does not start (exit 1: a driver may load before the next start)."""
    from appliance.clock import ManualClock
    from appliance.errors import BackendUnavailable
    from appliance.serving.app import build_thermal
    from appliance.thermal.fake_pynvml import FakePynvml

    cfg = load_config(None, {"thermal": {"sensor": "nvml"}})
    with mock.patch("appliance.thermal.nvml.pynvml", FakePynvml(device_count=0)), \
            pytest.raises(BackendUnavailable, match='config key thermal.sensor = "nvml" but NVML has no reading: .*'
                                                    'on a box without an NVIDIA GPU use "auto" or "none"'):
        build_thermal(cfg.thermal, ManualClock(), lambda: 0.0, gpu_engine=gpu)


def test_config_is_frozen() -> None:
    cfg = load_config()
    with pytest.raises(AttributeError):
        cfg.server.grace_s = 1.0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        cfg.engine.options.latency_s = 1.0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.write_bytes(b"[server]\ngrace_s = 1 # \xff\n"), "is not UTF-8 text"),
        (lambda p: p.write_text("[server\n"), "is not valid TOML"),
    ],
)
def test_file_errors_are_named(tmp_path: Path, setup: object, needle: str) -> None:
    path = tmp_path / "appliance.toml"
    setup(path)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=f"config file {re.escape(str(path))} {needle}"):
        load_config(path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_names_the_uid(tmp_path: Path) -> None:
    path = tmp_path / "appliance.toml"
    path.write_text("")
    path.chmod(0)
    with pytest.raises(ConfigError, match=f"not readable by uid {os.geteuid()}"):
        load_config(path)


def _tables(obj: object, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every table of the config (nested Struct and dataclass tables included), as key paths."""
    import dataclasses

    import msgspec

    names = ([f.name for f in msgspec.structs.fields(obj)] if isinstance(obj, msgspec.Struct)
             else [f.name for f in dataclasses.fields(obj)])  # type: ignore[arg-type]
    found = [prefix]
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, msgspec.Struct) or dataclasses.is_dataclass(value):
            found += _tables(value, (*prefix, name))
    return found


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_an_unknown_key_anywhere_is_named_by_its_full_path(data: st.DataObject) -> None:
    table = data.draw(st.sampled_from(_tables(load_config(None, {"engine": {"backend": "fake"}}))))
    name = data.draw(st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True))
    obj: object = load_config(None, {"engine": {"backend": "fake"}})
    for part in table:
        obj = getattr(obj, part)
    if hasattr(obj, name):
        return  # a known key (hypothesis rarely draws one)
    value = data.draw(st.one_of(st.integers(), st.text(max_size=5), st.booleans(), st.just({"x": 1})))
    raw: dict[str, object] = {name: value}
    for part in reversed(table):
        raw = {part: raw}
    raw.setdefault("engine", {})
    raw["engine"] = {**raw["engine"], "backend": "fake"}  # type: ignore[dict-item]
    path = ".".join((*table, name))
    with pytest.raises(ConfigError) as info:
        load_config(None, raw)  # type: ignore[arg-type]
    assert str(info.value).startswith(f"config key {path}: unknown "), str(info.value)


@pytest.mark.parametrize("section, key", [("model", "models_dir"), ("model", "pipelines_dir"), ("tls", "cert_file"),
                                          ("tls", "key_file"), ("tls", "client_ca_file")])
def test_a_relative_path_is_refused_naming_the_key(section: str, key: str) -> None:
    """Held-out review, session 18: ``models_dir = "models"`` was looked up under the working directory (/ under
    systemd), and the error named a manifest path the admin never wrote."""
    with pytest.raises(ConfigError, match=rf"config key {section}\.{key}: must be an absolute path, got 'x/y'"):
        load_config(None, {section: {key: "x/y"}})


@pytest.mark.parametrize("address, words", [
    ("unix-abstract:appliance", "gRPC's unix-abstract: addresses are not served here; use host:port or unix:PATH "
                                "(an abstract socket has no file mode"),
    ("dns:localhost:50051", "gRPC's dns: addresses are not served here"),
])
def test_a_grpc_uri_scheme_in_listen_is_named(address: str, words: str) -> None:
    """Held-out review, session 18: ``unix-abstract:x`` was read as host "unix-abstract" and port "x"."""
    with pytest.raises(ConfigError, match=re.escape(f"config key server.listen: '{address}': {words}")):
        load_config(None, {"server": {"listen": [address]}})


def test_tls_files_without_tls_listen_name_what_is_missing() -> None:
    """Held-out review, session 18: cert_file alone was answered "tls.key_file is required when tls.listen is set"
    though tls.listen was empty."""
    with pytest.raises(ConfigError, match=re.escape("config key tls.listen is empty but tls.cert_file is set: name "
                                                    "the TLS addresses in tls.listen, or remove the TLS files")):
        load_config(None, {"tls": {"cert_file": "/etc/hostname"}})
    with pytest.raises(ConfigError, match="tls.cert_file and tls.key_file are set"):
        load_config(None, {"tls": {"cert_file": "/etc/hostname", "key_file": "/etc/hostname"}})


@pytest.mark.parametrize(("visible", "device", "index"), [
    ("", 0, 0), ("", 1, 1), ("1", 0, 1), ("2,0", 1, 0), ("GPU-5f1c", 0, 0), ("3", 2, 2)])
def test_the_thermometer_watches_the_gpu_the_engine_runs_on(visible: str, device: int, index: int) -> None:
    """Held-out review, session 19: the governor always opened NVML index 0; with CUDA_VISIBLE_DEVICES=1 (or CUDA's
    fastest-first order) the engine ran on another GPU, unthrottled, while an idle one was watched."""
    from appliance.clock import ManualClock
    from appliance.serving.app import build_thermal
    from appliance.serving.thermal_loop import nvml_index
    from appliance.thermal.fake_pynvml import FakePynvml

    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", **({"CUDA_VISIBLE_DEVICES": visible} if visible else {})}
    assert nvml_index(device, env) == index
    cfg = load_config(None, {"thermal": {"sensor": "nvml"}})
    with mock.patch.dict(os.environ, env, clear=False), \
            mock.patch("appliance.thermal.nvml.pynvml", FakePynvml(device_count=4)):
        if not visible:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        controller = build_thermal(cfg.thermal, ManualClock(), lambda: 0.0, gpu_engine=True, cuda_device=device)
    assert controller.thermometer.index == index  # type: ignore[attr-defined]
