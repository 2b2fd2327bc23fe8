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
    jpeg2000_lowpass = true            # optional: validated on half-resolution JPEG 2000 input (the AUC is in
                                       # [metrics.<precision>.jpeg2000_lowpass]; `appliance models lowpass`)

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

The file is read through one schema (:mod:`appliance.schema`, the private ``_*File`` Structs below): unknown keys
are errors except in the free-form tables (``[input.preprocess]``, ``[postprocess]``, ``build``, ``[metrics]``).
A manifest that fails to parse or validate raises :class:`ManifestError` naming the file and the full key path,
e.g. ``model manifest /m/model.toml: key artifacts.int4.bytes: expected int, got str '12'``. An artifact whose
sha256 does not match raises :class:`ArtifactIntegrityError` naming the file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from appliance.errors import ArtifactIntegrityError, ConfigError, ManifestError
from appliance.schema import Schema, convert, read_toml

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

    def configured_artifact(self, precision: str) -> Artifact:
        """The artifact the config key ``model.precision`` names ("" = the default); ConfigError naming the key."""
        if precision and precision not in self.artifacts:
            raise ConfigError(f"config key model.precision = {precision!r}: {self.path} has no such artifact; have "
                              f"{sorted(self.artifacts)}")
        return self.artifact(precision or None)

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


Dim = Annotated[int, Meta(ge=1)]
Shape = Annotated[tuple[Dim, ...], Meta(min_length=1)]
Name = Annotated[str, Meta(min_length=1)]


class _InputFile(Schema, frozen=True):
    name: Name  # ONNX input name
    shape: Annotated[tuple[Dim, ...], Meta(min_length=4, max_length=4)]  # [B, C, H, W]
    dtype: Name
    preprocess: dict[str, Any] = msgspec.field(default_factory=dict)  # the pipeline contract (free-form)


class _OutputFile(Schema, frozen=True):
    name: Name
    shape: Shape
    meaning: str = ""


class _ArtifactFile(Schema, frozen=True):
    file: Name  # relative to the manifest's directory
    precision: Name
    sha256: Annotated[str, Meta(pattern="^[0-9a-fA-F]{64}$")]
    bytes: Annotated[int, Meta(ge=0)]
    block_size: Annotated[int, Meta(ge=1)] | None = None  # INT4 only
    tolerance: Annotated[float, Meta(ge=0.0, le=1000.0)] = DEFAULT_TOLERANCE
    quantization: str = ""  # one line for humans
    build: dict[str, Any] = msgspec.field(default_factory=dict)  # free-form
    session_config: dict[str, str] = msgspec.field(default_factory=dict)  # ONNX Runtime session config entries


class _ManifestFile(Schema, frozen=True):
    format_version: Literal[1]
    name: Name
    version: Name
    default_precision: Name
    input: _InputFile
    outputs: Annotated[tuple[_OutputFile, ...], Meta(min_length=1)]
    artifacts: Annotated[dict[str, _ArtifactFile], Meta(min_length=1)]
    description: str = ""
    postprocess: dict[str, Any] = msgspec.field(default_factory=dict)  # free-form
    metrics: dict[str, Any] = msgspec.field(default_factory=dict)  # by precision, free-form


def load_manifest(path: Path | str) -> Manifest:
    """Load and validate a manifest. Does not hash artifacts (call :meth:`Artifact.verify`).

    Raises:
        ManifestError: the file is unreadable or invalid; the message names the file and the full key path.
    """
    path = Path(path).resolve()
    where = f"model manifest {path}: key"
    raw = convert(read_toml(path, "model manifest", ManifestError), _ManifestFile, where=where, error=ManifestError)
    input_spec = InputSpec(raw.input.name, raw.input.shape, raw.input.dtype, dict(raw.input.preprocess))
    for i, out in enumerate(raw.outputs):
        if out.shape[0] != input_spec.batch_size:
            raise ManifestError(f"{where} outputs[{i}].shape: first dimension {out.shape[0]} != batch size "
                                f"{input_spec.batch_size} (input.shape[0])")
    if raw.default_precision not in raw.artifacts:
        raise ManifestError(f"{where} default_precision: {raw.default_precision!r} has no artifact; have "
                            f"{sorted(raw.artifacts)}")
    artifacts = {
        key: Artifact(
            precision=art.precision,
            path=(path.parent / art.file).resolve(),
            sha256=art.sha256.lower(),
            size_bytes=art.bytes,
            block_size=art.block_size,
            build=dict(art.build),
            session_config=dict(art.session_config),
            tolerance=art.tolerance,
        )
        for key, art in raw.artifacts.items()
    }
    return Manifest(
        path=path,
        name=raw.name,
        version=raw.version,
        description=raw.description,
        default_precision=raw.default_precision,
        input=input_spec,
        outputs=tuple(OutputSpec(o.name, o.shape, o.meaning) for o in raw.outputs),
        postprocess=dict(raw.postprocess),
        artifacts=artifacts,
        metrics=dict(raw.metrics),
    )
