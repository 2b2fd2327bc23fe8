"""Loading ``pipelines/<name>.toml``: every key, step and parameter validated once, against the model's contract.

The file is read through the shared schema loader (:mod:`appliance.schema`): the steps are a tagged union on
their ``name`` (:data:`appliance.pipeline.steps.AnyStep`). Unknown keys, steps or parameters, wrong types and
out-of-range values raise :class:`~appliance.errors.ConfigError` naming the file and the full key path, e.g.
``pipeline file pipelines/ct.toml: key steps[1].width: expected float >= 1.0, got 0.5``; a pipeline that
contradicts its model's ``[input.preprocess]`` contract is refused the same way.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta
from pydicom import uid as _uid

from appliance.errors import ConfigError, ManifestError
from appliance.manifest import Manifest, load_manifest
from appliance.pipeline.preprocess import Accept, Pipeline
from appliance.pipeline.steps import ORDER, STEPS, AnyStep, Normalize, Resize, Step, StepParams, Window
from appliance.schema import Schema, convert, read_toml

__all__ = ["build_steps", "load_pipeline", "load_pipelines"]

logger = logging.getLogger(__name__)

NonEmpty = Annotated[str, Meta(min_length=1)]
#: A list the key may be left out of (accept anything), but never empty.
Names = Annotated[tuple[NonEmpty, ...], Meta(min_length=1)]


class _AcceptFile(Schema, frozen=True):
    modalities: Names | None = None  # (0008,0060) values; unset = any
    sop_classes: Names | None = None  # UIDs or pydicom keywords; unset = any
    colour: Literal["reject", "luminance"] = "reject"
    min_size: Annotated[int, Meta(ge=1, le=65535)] = 1  # Rows and Columns at least this
    max_aspect: Annotated[float, Meta(ge=1.0, le=65535.0)] | None = None  # longer side / shorter side; unset = any


class _PipelineFile(Schema, frozen=True):
    model: Annotated[str, Meta(pattern=r"^[^/.][^/]*$")]  # a directory name under models_dir
    steps: Annotated[tuple[AnyStep, ...], Meta(min_length=1)]
    format_version: Literal[1] = 1
    name: NonEmpty | None = None  # default: the file name without .toml
    description: str = ""
    accept: _AcceptFile = msgspec.field(default_factory=_AcceptFile)


def _sop_class_uid(value: str, where: str) -> str:
    if value and all(part.isdigit() for part in value.split(".")):
        return value
    found = getattr(_uid, value, None)
    if isinstance(found, _uid.UID) and found.is_valid:
        return str(found)
    raise ConfigError(f"{where}: {value!r} is neither a UID nor a pydicom SOP class keyword")


def _accept(raw: _AcceptFile, where: str) -> Accept:
    sop_classes = raw.sop_classes
    return Accept(
        modalities=frozenset(raw.modalities) if raw.modalities is not None else None,
        sop_classes=(frozenset(_sop_class_uid(v, f"{where} accept.sop_classes[{i}]") for i, v in enumerate(sop_classes))
                     if sop_classes is not None else None),
        colour=raw.colour,
        min_size=raw.min_size,
        max_aspect=raw.max_aspect,
    )


def build_steps(raw: tuple[StepParams, ...], where: str) -> tuple[Step, ...]:
    """Return the registered steps for ``raw``, refusing a wrong order or a missing resize (errors name ``where``)."""
    steps = tuple(Step(STEPS[str(type(p).__struct_config__.tag)], p) for p in raw)
    for i in range(1, len(steps)):
        if ORDER[steps[i].name] <= ORDER[steps[i - 1].name]:
            raise ConfigError(
                f"{where} steps[{i}].name: {steps[i].name!r} after {steps[i - 1].name!r}; steps run once each, in "
                f"the order {', '.join(STEPS)}"
            )
    if "resize" not in {s.name for s in steps}:
        raise ConfigError(f"{where} steps: a 'resize' step is required (it writes the batch slot)")
    return steps


def _close(a: Any, b: Any) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=0.0, abs_tol=1e-6)
    except (TypeError, ValueError):
        return False


def _check_contract(steps: tuple[Step, ...], manifest: Manifest, where: str) -> None:
    """Refuse a pipeline whose steps contradict the model's ``[input.preprocess]`` contract."""
    pre = manifest.input.preprocess
    index = {s.name: i for i, s in enumerate(steps)}
    model = f"model {manifest.name!r} [input.preprocess]"

    def need(step: str, why: str) -> tuple[str, StepParams]:
        if step not in index:
            raise ConfigError(f"{where} steps: {model} {why}, but the pipeline has no {step!r} step")
        return f"{where} steps[{index[step]}]", steps[index[step]].params

    if "window_center" in pre or "window_width" in pre:
        need("modality_lut", "windows in modality units")
        at, win = need("window", "has a fixed window")
        assert isinstance(win, Window)
        if win.source != "pipeline":
            raise ConfigError(f"{at}.source: 'file' contradicts the fixed window of {model}")
        for key, value, mkey in (("center", win.center, "window_center"), ("width", win.width, "window_width")):
            if not _close(value, pre.get(mkey)):
                raise ConfigError(f"{at}.{key}: {value} contradicts {model} {mkey} = {pre.get(mkey)}")
    if "resize" in pre:
        at, resize = need("resize", f"resizes with {pre['resize']!r}")
        assert isinstance(resize, Resize)
        if resize.method != pre["resize"]:
            raise ConfigError(f"{at}.method: {resize.method!r} contradicts {model} resize = {pre['resize']!r}")
    for i, step in enumerate(steps):
        if isinstance(step.params, Resize) and step.params.jpeg2000_lowpass and pre.get("jpeg2000_lowpass") is not True:
            raise ConfigError(
                f"{where} steps[{i}].jpeg2000_lowpass: true, but {model} has no jpeg2000_lowpass = true (the model "
                "was not validated on half-resolution JPEG 2000 input; `appliance models lowpass` measures it)"
            )
    if pre.get("photometric") == "MONOCHROME2":
        need("invert_monochrome1", "expects MONOCHROME2")
    norm = steps[index["normalize"]].params if "normalize" in index else None
    assert norm is None or isinstance(norm, Normalize)
    _check_normalize_contract(norm, pre, f"{where} steps[{index.get('normalize', len(steps))}]", model)


def _check_normalize_contract(norm: Normalize | None, pre: Mapping[str, Any], at: str, model: str) -> None:
    kind = "none" if norm is None else norm.kind
    wanted = pre.get("normalize")
    if wanted is None:
        return
    if wanted == "window_unit":
        if kind != "none":
            raise ConfigError(
                f"{at}.kind: {kind!r} contradicts {model} normalize = 'window_unit' "
                "(the window already gives [0, 1]; use kind = 'none')"
            )
        return
    if wanted == "meanstd":
        if norm is None or kind != "meanstd" or not (
            _close(norm.mean, pre.get("mean")) and _close(norm.std, pre.get("std"))
        ):
            raise ConfigError(f"{at}: a 'normalize' step of kind 'meanstd' with the mean/std of {model} is needed")
        return
    raise ConfigError(f"{at}: {model} normalize = {wanted!r} is not supported by any step")


def load_pipeline(path: Path, models_dir: Path) -> Pipeline:
    """Load and validate one pipeline file against the manifest of the model it names.

    Args:
        path: ``pipelines/<name>.toml``.
        models_dir: the directory holding ``<model>/model.toml``.

    Raises:
        ConfigError: the file is unreadable or invalid, or contradicts its model; the message names the file
            and the full key path.
    """
    path = Path(path)
    where = f"pipeline file {path}: key"
    raw = convert(read_toml(path, "pipeline file", ConfigError), _PipelineFile, where=where, error=ConfigError)
    try:
        manifest = load_manifest(Path(models_dir) / raw.model / "model.toml")
    except ManifestError as e:
        raise ConfigError(f"{where} model: model = {raw.model!r} has no usable manifest: {e}") from e
    steps = build_steps(raw.steps, where)
    _check_contract(steps, manifest, where)
    item_shape = tuple(manifest.input.item_shape)
    if len(item_shape) != 3:
        raise ConfigError(f"{where} model: model {raw.model!r} input item shape {item_shape} is not (C, H, W)")
    return Pipeline(
        name=raw.name if raw.name is not None else path.stem,
        model=raw.model,
        input_shape=item_shape,
        steps=steps,
        accept=_accept(raw.accept, where),
        path=path,
        description=raw.description,
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
                f"pipeline file {path}: key name: {pipeline.name!r} is already used by {pipelines[pipeline.name].path}"
            )
        pipelines[pipeline.name] = pipeline
        logger.info("pipeline %s: model %s, input %s, steps %s", pipeline.name, pipeline.model,
                    pipeline.input_shape, [s.name for s in pipeline.steps])
    return pipelines
