"""Engine outputs of one frame -> findings (label, score) and the localisation peak in original pixels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from appliance.errors import ManifestError
from appliance.manifest import Manifest

__all__ = ["FrameFindings", "Postprocessor"]


@dataclass(frozen=True)
class FrameFindings:
    """What one frame's reply carries."""

    label: str  # decided by the model's threshold
    score: float  # probability of the positive class
    scores: dict[str, float]  # every label's probability
    location: tuple[float, float, float] | None  # (row, column, map value) in original pixels, if a map exists


class Postprocessor:
    """Reads the manifest once: which output is the score, which is the map, the threshold and labels.

    ``[postprocess]`` keys: ``threshold`` (default 0.5), ``labels`` ([negative, positive]), optional
    ``score_output`` / ``heatmap_output`` names (default: the first ``[B, 1]``/``[B]`` output and the first
    ``[B, h, w]`` output).
    """

    def __init__(self, manifest: Manifest) -> None:
        pp = manifest.postprocess
        self.threshold = float(pp.get("threshold", 0.5))
        labels = list(pp.get("labels", ["negative", "positive"]))
        if len(labels) != 2:
            raise ManifestError(f"{manifest.path}: [postprocess] labels must have 2 entries, got {labels}")
        self.negative, self.positive = str(labels[0]), str(labels[1])
        by_name = {o.name: o for o in manifest.outputs}
        score_output: str | None = pp.get("score_output") or next(
            (o.name for o in manifest.outputs if len(o.shape) == 1 or o.shape[1:] == (1,)), None
        )
        self.heatmap_output: str | None = pp.get("heatmap_output") or next(
            (o.name for o in manifest.outputs if len(o.shape) == 3), None
        )
        if score_output is None or score_output not in by_name:
            raise ManifestError(f"{manifest.path}: no score output ([postprocess] score_output)")
        self.score_output: str = score_output
        if self.heatmap_output is not None and self.heatmap_output not in by_name:
            raise ManifestError(f"{manifest.path}: [postprocess] heatmap_output {self.heatmap_output!r} unknown")
        self.input_hw = manifest.input.shape[-2:]

    def __call__(self, outputs: dict[str, np.ndarray], frame_info: Any) -> FrameFindings:
        """Turn one frame's output rows into findings. ``frame_info`` may carry ``original_shape``."""
        # scalars are clipped in Python: np.clip on one number costs ~5 us, this whole call ~3 us on the event loop
        score = _unit(float(np.asarray(outputs[self.score_output]).reshape(-1)[0]))
        label = self.positive if score >= self.threshold else self.negative
        location = None
        if self.heatmap_output is not None:
            hm = np.asarray(outputs[self.heatmap_output], dtype=np.float32)
            r, c = divmod(int(hm.argmax()), hm.shape[1])  # first maximum in C order, as np.unravel_index
            orig = getattr(frame_info, "original_shape", None) or self.input_hw
            # centre of the map cell, mapped to the original frame's pixel grid
            row = (r + 0.5) * orig[0] / hm.shape[0]
            col = (c + 0.5) * orig[1] / hm.shape[1]
            location = (float(row), float(col), _unit(float(hm[r, c])))
        return FrameFindings(label, score, {self.positive: score, self.negative: 1.0 - score}, location)


def _unit(value: float) -> float:
    """``value`` clipped to [0, 1] (NaN stays NaN, as with np.clip)."""
    return min(max(value, 0.0), 1.0)
