"""Pipelines: one frame of a DICOM instance into one float32 batch slot, through named steps.

The numerics of the model's input contract live in :mod:`appliance.pipeline.kernels`.

A :class:`Pipeline` (``pipelines/<name>.toml``) turns one frame of a validated
:class:`~appliance.dicom.DicomInstance` into one float32 batch slot. Its steps come from a small registry
(:data:`appliance.pipeline.steps.STEPS`) and always run in this order, each at most once::

    modality_lut        stored -> modality units (Rescale Slope/Intercept per frame, or the Modality LUT Seq.)
    window              the pipeline's fixed window (center/width, modality units) or the file's VOI -> [0, 1]
    invert_monochrome1  1 - x for MONOCHROME1 but not CT, whose HU it does not change (docs/dicom.md)
    resize              area resize to the model's H x W, written straight into the batch slot; with
                        ``jpeg2000_lowpass = true`` a plain reversible JPEG 2000 frame of twice the model's
                        size, or of four times it and more, is decoded at half resolution instead (its 5/3
                        low-pass band, re-centred by a quarter pixel; docs/dicom.md), where the model's manifest
                        allows it
    normalize           "none", or (x - mean) / std

Pipeline file format (``format_version = 1``)::

    format_version = 1
    name = "ct-nodule"            # optional; defaults to the file stem
    model = "ct-nodule"           # models/<model>/model.toml supplies input_shape and the contract
    description = "..."

    [accept]                      # check(): anything else is NOT_APPLICABLE (FAILED_PRECONDITION)
    modalities = ["CT"]           # (0008,0060); omit to accept any
    sop_classes = ["CTImageStorage", "1.2.840.10008.5.1.4.1.1.2.1"]   # pydicom keywords or UIDs; omit = any
    colour = "reject"             # "reject" colour/palette images, or convert them to "luminance"

    [[steps]]
    name = "window"
    center = -600.0
    width = 1500.0
    source = "pipeline"           # or "file": the file's first VOI window when its width >= 1

Loading validates everything once (unknown key, step or parameter -> :class:`ConfigError` naming the file
and key) and refuses a pipeline that contradicts its model's ``[input.preprocess]`` contract (another window,
another resize, a missing MONOCHROME1 inversion, another normalisation).

Hot path: every step writes float32 in place in one full-resolution scratch buffer, then the resize writes
into the caller's slot; pydicom's float64 LUT helpers are not used (docs/dicom.md).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydicom import uid as _uid

from appliance.dicom import DicomInstance, tag_name
from appliance.dicom.syntaxes import MODALITIES, defined_term, uid_label
from appliance.errors import DicomError, NotApplicable
from appliance.pipeline.kernels import recentre_lowpass
from appliance.pipeline.steps import Frame, FrameInfo, Resize, Step, load_frame

__all__ = ["Accept", "Pipeline"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Accept:
    """What :meth:`Pipeline.check` lets through."""

    modalities: frozenset[str] | None  # (0008,0060) values; None = any
    sop_classes: frozenset[str] | None  # UIDs; None = any image class
    colour: str  # "reject" or "luminance"
    min_size: int = 1  # Rows and Columns at least this
    max_aspect: float | None = None  # longer side / shorter side at most this; None = any


@dataclass(frozen=True)
class Pipeline:
    """A loaded, validated, immutable preprocessing pipeline (``pipelines/<name>.toml``)."""

    name: str
    model: str  # model name: models/<model>/model.toml
    input_shape: tuple[int, ...]  # one batch item, (C, H, W), from the model manifest
    steps: tuple[Step, ...]  # in execution order
    accept: Accept
    path: Path  # the TOML file
    description: str = ""

    def __repr__(self) -> str:
        """Return the name, model, shape and step names."""
        steps = ", ".join(s.name for s in self.steps)
        return (f"Pipeline({self.name!r}, model={self.model!r}, input_shape={self.input_shape}, "
                f"steps=[{steps}])")

    def check(self, inst: DicomInstance) -> None:
        """Raise :class:`NotApplicable` (naming the tag) unless this pipeline can use ``inst``.

        Checks, in order: SOP class, modality, colour and size against ``[accept]``.
        """
        acc = self.accept
        if acc.sop_classes is not None and inst.sop_class_uid not in acc.sop_classes:
            accepted = ", ".join(sorted(_uid.UID(u).name for u in acc.sop_classes))
            raise NotApplicable(
                f"{tag_name('SOPClassUID')} {uid_label(inst.sop_class_uid)} is not accepted by "
                f"pipeline {self.name!r} (accepts {accepted})"
            )
        if acc.modalities is not None and inst.modality not in acc.modalities:
            raise NotApplicable(
                f"{tag_name('Modality')} {defined_term(inst.modality, MODALITIES)} is not accepted by pipeline "
                f"{self.name!r} "
                f"(accepts {', '.join(sorted(acc.modalities))})"
            )
        if acc.colour == "reject" and inst.photometric not in ("MONOCHROME1", "MONOCHROME2"):
            raise NotApplicable(
                f"{tag_name('PhotometricInterpretation')} {inst.photometric!r} is colour; pipeline "
                f"{self.name!r} needs grayscale (MONOCHROME1/MONOCHROME2)"
            )
        # a 1 x 512 or 2 x 4096 "CT" was stretched to the model's input and scored with confidence (held-out review,
        # session 19): an image this small or this long is not what the pipeline's model was trained on
        size = f"{tag_name('Rows')} x {tag_name('Columns')} = {inst.rows} x {inst.columns}"
        if min(inst.rows, inst.columns) < acc.min_size:
            raise NotApplicable(f"{size} is smaller than pipeline {self.name!r} accepts (at least {acc.min_size} "
                                f"x {acc.min_size})")
        aspect = max(inst.rows, inst.columns) / max(min(inst.rows, inst.columns), 1)
        if acc.max_aspect is not None and aspect > acc.max_aspect:
            raise NotApplicable(f"{size} is {aspect:.3g} times longer than it is wide; pipeline {self.name!r} "
                                f"accepts at most {acc.max_aspect:g}")

    def run(self, inst: DicomInstance, frame: int, out: np.ndarray) -> FrameInfo:
        """Decode frame ``frame`` of ``inst``, apply the steps, and write float32 into ``out``.

        Args:
            inst: a parsed instance that passed :meth:`check`.
            frame: frame index, 0-based.
            out: the batch slot, float32 of shape :attr:`input_shape` (a view into the batch buffer).

        Raises:
            DicomError: the frame cannot be decoded, or its values are unusable.
            ValueError: ``out`` has the wrong shape or dtype (a caller bug).
        """
        if out.shape != self.input_shape or out.dtype != np.float32:
            raise ValueError(f"out must be float32 {self.input_shape}, got {out.dtype} {out.shape}")
        band = self._lowpass_band(inst, frame)
        if band is not None:
            fr = Frame(inst, frame, band, out)
            load_frame(fr, band, inst.photometric)
            recentre_lowpass(fr.image)
        else:
            arr, photometric = inst.decode_frame_raw(frame, raw=True)
            fr = Frame(inst, frame, arr, out)
            load_frame(fr, arr, photometric)
        for step in self.steps:
            step.spec.apply(fr, step.params)
        if not np.isfinite(out).all():  # last guard: a model never sees NaN/inf, and bad input is no bug
            raise DicomError(
                f"frame {frame} gives non-finite model input; check {tag_name('RescaleSlope')} and "
                f"{tag_name('RescaleIntercept')}",
                field="dicom.RescaleSlope",
            )
        h, w = self.input_shape[-2:]
        return FrameInfo(
            original_shape=(inst.rows, inst.columns),
            pixel_spacing=inst.pixel_spacing,
            scale_to_original=(inst.rows / h, inst.columns / w),
            lossy=inst.lossy,
            lowpass=band is not None,
        )

    @functools.cached_property
    def jpeg2000_lowpass(self) -> bool:
        """The resize step may use a JPEG 2000 frame's half-resolution low-pass band (``jpeg2000_lowpass``)."""
        return any(isinstance(s.params, Resize) and s.params.jpeg2000_lowpass for s in self.steps)

    def _lowpass_band(self, inst: DicomInstance, frame: int) -> np.ndarray | None:
        """The frame's low-pass band when this pipeline takes it and the band suits the model's size.

        The band must be the model's size exactly (a frame of twice its rows and columns, the case the model was
        validated on) or at least twice it in both dimensions; in between, resizing the band by a factor under 2
        is not the contract's area mean of the full frame (docs/dicom.md). Colour frames and a Modality LUT
        Sequence (a table indexed by stored value, which a band's averaged values are not) always decode in full.
        So does a frame the half-resolution decoder fails on: the transfer syntax's own decoder then decides,
        with its own error, whether the frame is usable.
        """
        h, w = self.input_shape[-2:]
        exact = inst.rows == 2 * h and inst.columns == 2 * w
        large = inst.rows >= 4 * h and inst.columns >= 4 * w
        if (not self.jpeg2000_lowpass or not (exact or large)
                or inst.photometric not in ("MONOCHROME1", "MONOCHROME2") or inst.modality_lut is not None):
            return None
        try:
            return inst.decode_frame_lowpass(frame)
        except DicomError as e:
            logger.debug("frame %d: no half-resolution decode (%s); decoding in full", frame, e)
            return None
