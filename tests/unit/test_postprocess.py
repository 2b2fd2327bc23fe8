"""Postprocessing of one frame's engine outputs: label by threshold, clipped score, the map's peak in pixels."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from appliance.pipeline.postprocess import Postprocessor
from tests.support import write_fake_model


@dataclass
class _Info:
    original_shape: tuple[int, int]


@pytest.fixture
def post(tmp_path: Path) -> Postprocessor:
    return Postprocessor(write_fake_model(tmp_path, heatmap=4))


def _outputs(post: Postprocessor, score: float, hm: np.ndarray) -> dict[str, np.ndarray]:
    return {post.score_output: np.array([score], np.float32), str(post.heatmap_output): hm.astype(np.float32)}


def test_the_peak_cell_centre_is_mapped_to_the_original_frame_and_scores_are_clipped(post: Postprocessor) -> None:
    hm = np.zeros((4, 4))
    hm[2, 1] = 1.7  # above 1: clipped like the score
    found = post(_outputs(post, 1.25, hm), _Info((512, 256)))
    assert found.score == 1.0 and found.label == post.positive
    assert found.scores == {post.positive: 1.0, post.negative: 0.0}
    assert found.location == (2.5 * 512 / 4, 1.5 * 256 / 4, 1.0)


def test_ties_take_the_first_peak_in_row_major_order_and_low_scores_are_negative(post: Postprocessor) -> None:
    hm = np.full((4, 4), -0.5)
    hm[1, 3] = hm[3, 0] = 0.25
    found = post(_outputs(post, -0.1, hm), None)  # no frame info: the model's input size
    assert found.score == 0.0 and found.label == post.negative
    h, w = post.input_hw
    assert found.location == (1.5 * h / 4, 3.5 * w / 4, 0.25)


def test_a_nan_score_stays_nan_and_is_not_positive(post: Postprocessor) -> None:
    found = post(_outputs(post, float("nan"), np.zeros((4, 4))), None)
    assert np.isnan(found.score) and found.label == post.negative
