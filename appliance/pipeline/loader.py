"""Loading ``pipelines/<name>.toml``: every key, step and parameter validated once, against the model's contract.

Unknown keys, steps or parameters raise :class:`~appliance.errors.ConfigError` naming the file and key; a
pipeline that contradicts its model's ``[input.preprocess]`` contract is refused.
"""

from __future__ import annotations

import logging
import math
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydicom import uid as _uid

from appliance.errors import ConfigError, ManifestError
from appliance.manifest import Manifest, load_manifest
from appliance.pipeline.preprocess import Accept, Pipeline
from appliance.pipeline.steps import NUMBER, ORDER, REQUIRED, STEPS, Step

__all__ = ["load_pipeline", "load_pipelines"]

logger = logging.getLogger(__name__)


_TOP_KEYS = frozenset({"format_version", "name", "model", "description", "accept", "steps"})
_ACCEPT_KEYS = frozenset({"modalities", "sop_classes", "colour"})


def _sop_class_uid(value: str, where: str) -> str:
    if value and all(part.isdigit() for part in value.split(".")):
        return value
    found = getattr(_uid, value, None)
    if isinstance(found, _uid.UID) and found.is_valid:
        return str(found)
    raise ConfigError(f"{where}: {value!r} is neither a UID nor a pydicom SOP class keyword")


def _str_list(table: Mapping[str, Any], key: str, where: str) -> list[str] | None:
    if key not in table:
        return None
    value = table[key]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}.{key}: must be a non-empty list of strings (omit the key to accept any)")
    return value


def _load_accept(raw: Any, where: str) -> Accept:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a table")
    for key in raw:
        if key not in _ACCEPT_KEYS:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(_ACCEPT_KEYS))})")
    modalities = _str_list(raw, "modalities", where)
    sop_classes = _str_list(raw, "sop_classes", where)
    colour = raw.get("colour", "reject")
    if colour not in ("reject", "luminance"):
        raise ConfigError(f"{where}.colour: must be 'reject' or 'luminance', got {colour!r}")
    return Accept(
        modalities=frozenset(modalities) if modalities is not None else None,
        sop_classes=(frozenset(_sop_class_uid(v, f"{where}.sop_classes") for v in sop_classes)
                     if sop_classes is not None else None),
        colour=colour,
    )


def _load_step(raw: Any, where: str) -> Step:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a table")
    name = raw.get("name")
    if name not in STEPS:
        raise ConfigError(f"{where}.name: {name!r} is not a known step (known: {', '.join(STEPS)})")
    spec = STEPS[name]
    where = f"{where} ({name})"
    params: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "name":
            continue
        if key not in spec.params:
            known = ", ".join(spec.params) or "none"
            raise ConfigError(f"{where}: unknown key {key!r} (known: {known})")
        types = spec.params[key][0]
        if isinstance(value, bool) or not isinstance(value, types):
            wanted = " or ".join(t.__name__ for t in types)
            raise ConfigError(f"{where}.{key}: must be {wanted}, got {value!r}")
        params[key] = float(value) if types is NUMBER else value
    for key, (_types, default) in spec.params.items():
        if key not in params:
            if default is REQUIRED:
                raise ConfigError(f"{where}: missing key {key!r}")
            params[key] = default
    if spec.check is not None and (problem := spec.check(params)):
        raise ConfigError(f"{where}.{problem}")
    return Step(spec, MappingProxyType(params))


def _load_steps(raw: Any, where: str) -> tuple[Step, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: [[steps]] must be a non-empty array of tables")
    steps = tuple(_load_step(item, f"{where}[{i}]") for i, item in enumerate(raw))
    for i in range(1, len(steps)):
        if ORDER[steps[i].name] <= ORDER[steps[i - 1].name]:
            raise ConfigError(
                f"{where}[{i}].name: {steps[i].name!r} after {steps[i - 1].name!r}; steps run once each, in "
                f"the order {', '.join(STEPS)}"
            )
    if "resize" not in {s.name for s in steps}:
        raise ConfigError(f"{where}: a 'resize' step is required (it writes the batch slot)")
    return steps


def _close(a: Any, b: Any) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=0.0, abs_tol=1e-6)
    except (TypeError, ValueError):
        return False


def _check_contract(steps: tuple[Step, ...], manifest: Manifest, where: str) -> None:
    """Refuse a pipeline whose steps contradict the model's ``[input.preprocess]`` contract."""
    pre = manifest.input.preprocess
    by_name = {s.name: s.params for s in steps}
    model = f"model {manifest.name!r} [input.preprocess]"

    def need(step: str, why: str) -> Mapping[str, Any]:
        if step not in by_name:
            raise ConfigError(f"{where}: steps: {model} {why}, but the pipeline has no {step!r} step")
        return by_name[step]

    if "window_center" in pre or "window_width" in pre:
        need("modality_lut", "windows in modality units")
        win = need("window", "has a fixed window")
        if win["source"] != "pipeline":
            raise ConfigError(
                f"{where}: steps (window).source: 'file' contradicts the fixed window of {model}"
            )
        for key, mkey in (("center", "window_center"), ("width", "window_width")):
            if not _close(win[key], pre.get(mkey)):
                raise ConfigError(
                    f"{where}: steps (window).{key} = {win[key]} contradicts {model} {mkey} = {pre.get(mkey)}"
                )
    if "resize" in pre and need("resize", f"resizes with {pre['resize']!r}")["method"] != pre["resize"]:
        raise ConfigError(
            f"{where}: steps (resize).method = {by_name['resize']['method']!r} contradicts {model} "
            f"resize = {pre['resize']!r}"
        )
    if pre.get("photometric") == "MONOCHROME2":
        need("invert_monochrome1", "expects MONOCHROME2")
    _check_normalize_contract(by_name.get("normalize"), pre, where, model)


def _check_normalize_contract(norm: Mapping[str, Any] | None, pre: Mapping[str, Any], where: str,
                              model: str) -> None:
    kind = "none" if norm is None else norm["kind"]
    wanted = pre.get("normalize")
    if wanted is None:
        return
    if wanted == "window_unit":
        if kind != "none":
            raise ConfigError(
                f"{where}: steps (normalize).kind = {kind!r} contradicts {model} normalize = 'window_unit' "
                "(the window already gives [0, 1]; use kind = 'none')"
            )
        return
    if wanted == "meanstd":
        if norm is None or kind != "meanstd" or not (
            _close(norm["mean"], pre.get("mean")) and _close(norm["std"], pre.get("std"))
        ):
            raise ConfigError(
                f"{where}: steps (normalize) must be kind 'meanstd' with the mean/std of {model}"
            )
        return
    raise ConfigError(f"{where}: {model} normalize = {wanted!r} is not supported by any step")


def load_pipeline(path: Path, models_dir: Path) -> Pipeline:
    """Load and validate one pipeline file against the manifest of the model it names.

    Args:
        path: ``pipelines/<name>.toml``.
        models_dir: the directory holding ``<model>/model.toml``.

    Raises:
        ConfigError: the file is unreadable or invalid, or contradicts its model; the message names the file
            and key.
    """
    path = Path(path)
    where = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"pipeline file {where} not found") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{where}: cannot read TOML: {e}") from e
    for key in raw:
        if key not in _TOP_KEYS:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(_TOP_KEYS))})")
    if raw.get("format_version", 1) != 1:
        raise ConfigError(f"{where}: format_version must be 1, got {raw.get('format_version')!r}")
    name = raw.get("name", path.stem)
    model = raw.get("model")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: name must be a non-empty string")
    if not isinstance(model, str) or not model or "/" in model or model.startswith("."):
        raise ConfigError(f"{where}: model must be a model directory name, got {model!r}")
    try:
        manifest = load_manifest(Path(models_dir) / model / "model.toml")
    except ManifestError as e:
        raise ConfigError(f"{where}: model = {model!r}: {e}") from e
    steps = _load_steps(raw.get("steps"), f"{where}: steps")
    _check_contract(steps, manifest, where)
    item_shape = tuple(manifest.input.item_shape)
    if len(item_shape) != 3:
        raise ConfigError(f"{where}: model {model!r} input item shape {item_shape} is not (C, H, W)")
    description = raw.get("description", "")
    return Pipeline(
        name=name,
        model=model,
        input_shape=item_shape,
        steps=steps,
        accept=_load_accept(raw.get("accept", {}), f"{where}: [accept]"),
        path=path,
        description=description if isinstance(description, str) else "",
    )


def load_pipelines(pipelines_dir: Path, models_dir: Path) -> dict[str, Pipeline]:
    """Load every ``*.toml`` in ``pipelines_dir``, by pipeline name.

    Raises:
        ConfigError: any file is invalid, or two files declare the same name.
    """
    pipelines: dict[str, Pipeline] = {}
    for path in sorted(Path(pipelines_dir).glob("*.toml")):
        pipeline = load_pipeline(path, models_dir)
        if pipeline.name in pipelines:
            raise ConfigError(
                f"{path}: name {pipeline.name!r} is already used by {pipelines[pipeline.name].path}"
            )
        pipelines[pipeline.name] = pipeline
        logger.info("pipeline %s: model %s, input %s, steps %s", pipeline.name, pipeline.model,
                    pipeline.input_shape, [s.name for s in pipeline.steps])
    return pipelines
