"""Every file in pydicom's bundled test_files folder, DICOM or not, through parse -> check -> run.

Each file must end in success (every frame written into a slot, finite, in [0, 1]) or in one of the
client-facing errors with a non-empty message. Any other exception type fails. Two pipelines run: the real
``ct-nodule`` (CT only, colour rejected) and a permissive ``any-grey`` test pipeline that lets every image
through, so that every decoder path is exercised.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pydicom
import pytest
from dicom_testkit import any_grey_pipeline, ct_pipeline

from appliance.dicom import parse
from appliance.errors import DicomError, LimitExceeded, NotApplicable, UnsupportedTransferSyntax
from appliance.pipeline.preprocess import Pipeline

TEST_FILES = pathlib.Path(pydicom.data.__file__).parent / "test_files"
FILES = sorted(p for p in TEST_FILES.rglob("*") if p.is_file())
CLIENT_ERRORS = (DicomError, UnsupportedTransferSyntax, LimitExceeded, NotApplicable)

# Pinned outcomes for files with a known story: (file, ct-nodule outcome, any-grey outcome).
KNOWN = {
    "CT_small.dcm": ("OK", "OK"),
    "693_J2KI.dcm": ("OK", "OK"),
    "J2K_pixelrep_mismatch.dcm": ("OK", "OK"),
    "MR_small.dcm": ("NotApplicable", "OK"),
    "MR_truncated.dcm": ("DicomError", "DicomError"),
    "JPEG-lossy.dcm": ("NotApplicable", "DicomError"),  # libjpeg -1038, found only when decoding
    "JPGExtended.dcm": ("NotApplicable", "OK"),  # 12-bit; its frame ends FF D9 FF (a pad byte of FF)
    "badVR.dcm": ("DicomError", "DicomError"),
    "no_meta.dcm": ("DicomError", "DicomError"),
    "meta_missing_tsyntax.dcm": ("DicomError", "DicomError"),
    "rtplan.dcm": ("NotApplicable", "NotApplicable"),
    "test-SR.dcm": ("NotApplicable", "NotApplicable"),
    "examples_ybr_color.dcm": ("NotApplicable", "OK"),  # 30-frame YBR JPEG
    "liver_1frame.dcm": ("NotApplicable", "OK"),  # 1-bit SEG
    "examples_palette.dcm": ("NotApplicable", "OK"),
    "dicomdirtests/77654033/CR1/6154": ("NotApplicable", "OK"),  # MONOCHROME1 CR
    "zipMR.gz": ("DicomError", "DicomError"),
}


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pipeline]:
    return {
        "ct-nodule": ct_pipeline(tmp_path_factory.mktemp("ct")),
        "any-grey": any_grey_pipeline(tmp_path_factory.mktemp("grey")),
    }


def _analyze(data: bytes, pipeline: Pipeline) -> str:
    try:
        inst = parse(data)
        pipeline.check(inst)
        out = np.full(pipeline.input_shape, np.nan, dtype=np.float32)
        for frame in range(inst.number_of_frames):
            out.fill(np.nan)
            pipeline.run(inst, frame, out)
            assert np.isfinite(out).all(), f"frame {frame}: non-finite output"
            assert out.min() >= 0.0 and out.max() <= 1.0, f"frame {frame}: outside [0, 1]"
    except CLIENT_ERRORS as e:
        assert str(e).strip(), f"{type(e).__name__} without a message"
        return type(e).__name__
    return "OK"


@pytest.mark.parametrize("pipeline_name", ["ct-nodule", "any-grey"])
@pytest.mark.parametrize("path", FILES, ids=[p.relative_to(TEST_FILES).as_posix() for p in FILES])
def test_every_bundled_file_ends_ok_or_in_a_client_error(path, pipeline_name, pipelines):
    outcome = _analyze(path.read_bytes(), pipelines[pipeline_name])
    rel = path.relative_to(TEST_FILES).as_posix()
    if rel in KNOWN:
        assert outcome == KNOWN[rel][0 if pipeline_name == "ct-nodule" else 1]


def test_corpus_is_all_there():
    names = {p.relative_to(TEST_FILES).as_posix() for p in FILES}
    assert len(FILES) >= 150
    assert set(KNOWN) <= names
