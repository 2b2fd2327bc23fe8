"""The model manifest: ``models/<name>/model.toml``, loaded and verified once.

Format (``format_version = 1``)::

    format_version = 1
    name = "ct-nodule"                 # model name, also the directory name
    version = "1.0.0"
    description = "..."                # one line
    default_precision = "int4"         # which artifact the daemon serves unless told otherwise

    [input]
    name = "image"                     # ONNX input name
    shape = [8, 1, 256, 256]           # fixed: [B, C, H, W]; B is the compiled-in batch size
    dtype = "float32"
    [input.preprocess]                 # what a pipeline must apply to satisfy the contract
    window_center = -600.0             # modality units (HU)
    window_width = 1500.0
    resize = "area"                    # appliance.pipeline.preprocess.resize_area
    normalize = "window_unit"          # appliance.pipeline.preprocess.window_to_unit -> [0, 1]
    photometric = "MONOCHROME2"        # MONOCHROME1 is inverted before the model sees it

    [[outputs]]
    name = "prob"                      # ONNX output name
    shape = [8, 1]
    meaning = "probability that the slice contains a nodule >= 4 mm"
    [[outputs]]
    name = "heatmap"
    shape = [8, 16, 16]
    meaning = "per-patch nodule probability (coarse localisation map)"

    [postprocess]
    threshold = 0.5                    # prob >= threshold -> label "nodule", else "no_nodule"
    labels = ["no_nodule", "nodule"]

    [artifacts.int4]                   # one table per precision
    file = "ct-nodule.int4.onnx"       # relative to the manifest's directory
    precision = "int4"
    sha256 = "..."
    bytes = 123
    block_size = 32                    # INT4 only
    tolerance = 0.02                   # optional: max |output - ORT-CPU output of this artifact| another
                                       # backend (GPU) may show; default DEFAULT_TOLERANCE
    [artifacts.int4.build]             # free-form build information (seed, versions, command)
    [artifacts.int4.session_config]    # optional ONNX Runtime session config entries (string -> string)

    [metrics.int4]                     # free-form measured metrics (AUC, ms per batch, ...)

A manifest that fails to parse or validate raises :class:`ManifestError` naming the file and key. An
artifact whose sha256 does not match raises :class:`ArtifactIntegrityError` naming the file.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.errors import ArtifactIntegrityError, ManifestError

__all__ = [
    "DEFAULT_TOLERANCE",
    "Artifact",
    "InputSpec",
    "Manifest",
    "OutputSpec",
    "load_manifest",
    "sha256_file",
]


#: Max |output difference| between a backend and ORT on the CPU, for an artifact without ``tolerance``.
DEFAULT_TOLERANCE = 0.02


@dataclass(frozen=True)
class InputSpec:
    """The model's input contract."""

    name: str  # ONNX input name
    shape: tuple[int, ...]  # fixed [B, C, H, W]
    dtype: str  # "float32"
    preprocess: dict[str, Any]  # what the pipeline must apply (see module docstring)

    @property
    def batch_size(self) -> int:
        """The compiled-in batch size B."""
        return self.shape[0]

    @property
    def item_shape(self) -> tuple[int, ...]:
        """The shape of one batch slot, ``shape[1:]``."""
        return self.shape[1:]


@dataclass(frozen=True)
class OutputSpec:
    """One model output."""

    name: str  # ONNX output name
    shape: tuple[int, ...]  # fixed, first dimension B
    meaning: str  # one line for humans


@dataclass(frozen=True)
class Artifact:
    """One ONNX file of the model at one precision."""

    precision: str  # "fp32", "int4", ...
    path: Path  # absolute path
    sha256: str  # expected hex digest
    size_bytes: int  # expected size
    block_size: int | None  # INT4 block size, else None
    build: dict[str, Any] = field(default_factory=dict)  # free-form build information
    session_config: dict[str, str] = field(default_factory=dict)  # ONNX Runtime session config entries
    tolerance: float = DEFAULT_TOLERANCE  # max |output - ORT-CPU output| for another backend

    def verify(self) -> None:
        """Raise :class:`ArtifactIntegrityError` unless the file exists and its sha256 matches."""
        if not self.path.is_file():
            raise ArtifactIntegrityError(f"model artifact {self.path} is missing")
        actual = sha256_file(self.path)
        if actual != self.sha256:
            raise ArtifactIntegrityError(
                f"model artifact {self.path} has sha256 {actual}, manifest expects {self.sha256}"
            )


@dataclass(frozen=True)
class Manifest:
    """A parsed, validated ``model.toml``."""

    path: Path  # the manifest file
    name: str
    version: str
    description: str
    default_precision: str
    input: InputSpec
    outputs: tuple[OutputSpec, ...]
    postprocess: dict[str, Any]
    artifacts: dict[str, Artifact]  # by precision
    metrics: dict[str, Any]  # by precision, free-form

    @property
    def directory(self) -> Path:
        """The model directory."""
        return self.path.parent

    def artifact(self, precision: str | None = None) -> Artifact:
        """Return the artifact for ``precision`` (default: ``default_precision``)."""
        key = precision or self.default_precision
        try:
            return self.artifacts[key]
        except KeyError:
            raise ManifestError(
                f"{self.path}: no artifact with precision {key!r}; have {sorted(self.artifacts)}"
            ) from None


def sha256_file(path: Path) -> str:
    """Return the hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _req(table: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if key not in table:
        raise ManifestError(f"{where}: missing key {key!r}")
    value = table[key]
    if not isinstance(value, typ):
        raise ManifestError(f"{where}: key {key!r} has type {type(value).__name__}")
    return value


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, int) and v > 0 for v in value):
        raise ManifestError(f"{where}: shape must be a non-empty list of positive integers, got {value!r}")
    return tuple(value)


def load_manifest(path: Path | str) -> Manifest:
    """Load and validate a manifest. Does not hash artifacts (call :meth:`Artifact.verify`)."""
    path = Path(path).resolve()
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"model manifest {path} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ManifestError(f"{path}: invalid TOML: {e}") from e
    where = str(path)
    if raw.get("format_version") != 1:
        raise ManifestError(f"{where}: format_version must be 1, got {raw.get('format_version')!r}")
    inp = _req(raw, "input", dict, where)
    input_spec = InputSpec(
        name=_req(inp, "name", str, f"{where} [input]"),
        shape=_shape(_req(inp, "shape", list, f"{where} [input]"), f"{where} [input]"),
        dtype=_req(inp, "dtype", str, f"{where} [input]"),
        preprocess=dict(inp.get("preprocess", {})),
    )
    if len(input_spec.shape) != 4:
        raise ManifestError(f"{where} [input]: shape must be [B, C, H, W], got {list(input_spec.shape)}")
    outputs = []
    for i, out in enumerate(_req(raw, "outputs", list, where)):
        w = f"{where} [[outputs]][{i}]"
        shape = _shape(_req(out, "shape", list, w), w)
        if shape[0] != input_spec.batch_size:
            raise ManifestError(f"{w}: first dimension {shape[0]} != batch size {input_spec.batch_size}")
        outputs.append(OutputSpec(_req(out, "name", str, w), shape, str(out.get("meaning", ""))))
    artifacts = {}
    for key, art in _req(raw, "artifacts", dict, where).items():
        w = f"{where} [artifacts.{key}]"
        block = art.get("block_size")
        artifacts[key] = Artifact(
            precision=_req(art, "precision", str, w),
            path=(path.parent / _req(art, "file", str, w)).resolve(),
            sha256=_req(art, "sha256", str, w).lower(),
            size_bytes=int(_req(art, "bytes", int, w)),
            block_size=int(block) if block is not None else None,
            build=dict(art.get("build", {})),
            session_config={str(k): str(v) for k, v in art.get("session_config", {}).items()},
            tolerance=float(_req(art, "tolerance", (int, float), w)) if "tolerance" in art else DEFAULT_TOLERANCE,
        )
    if not artifacts:
        raise ManifestError(f"{where}: [artifacts] is empty")
    default = _req(raw, "default_precision", str, where)
    if default not in artifacts:
        raise ManifestError(f"{where}: default_precision {default!r} has no artifact; have {sorted(artifacts)}")
    return Manifest(
        path=path,
        name=_req(raw, "name", str, where),
        version=_req(raw, "version", str, where),
        description=str(raw.get("description", "")),
        default_precision=default,
        input=input_spec,
        outputs=tuple(outputs),
        postprocess=dict(raw.get("postprocess", {})),
        artifacts=artifacts,
        metrics=dict(raw.get("metrics", {})),
    )
