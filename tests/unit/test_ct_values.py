"""CT files that decode but whose values cannot be Hounsfield units, or whose image is no CT slice: refused.

Each case came from the session 19 held-out review of the front door, scored with confidence before (the review's
reference slice, seed 21, is nodule 0.5948): an enhanced CT without the intercept in its Pixel Value Transformation
item (no_nodule 0.9946), a signed JPEG 2000 stream under an unsigned header (0.9943), a Modality LUT on a CT
(0.9946), a slope of 1e30 (nodule 0.9427), a 1 x 512 image (no_nodule 0.9999).
"""

from __future__ import annotations

import numpy as np
import openjpeg
import pytest
from dicom_testkit import REPO, make_dataset, to_bytes
from pydicom.dataset import Dataset
from pydicom.encaps import encapsulate
from pydicom.uid import EnhancedCTImageStorage, JPEG2000Lossless

from appliance.dicom import parse
from appliance.errors import DicomError, NotApplicable
from appliance.pipeline.loader import load_pipeline
from appliance.tools import synthetic

OUT_SHAPE = (1, 256, 256)


@pytest.fixture(scope="module", params=["ct-nodule", "ct-nodule-fast"])
def pipeline(request):  # noqa: ANN001, ANN201
    return load_pipeline(REPO / "pipelines" / f"{request.param}.toml", REPO / "models")


def _stored(size: int = 256) -> np.ndarray:
    return synthetic.stored_values(synthetic.generate_slice(3, size=size)).astype(np.uint16)


def _run(pipeline, data: bytes) -> None:  # noqa: ANN001
    inst = parse(data)
    pipeline.check(inst)
    for frame in range(inst.number_of_frames):
        pipeline.run(inst, frame, np.zeros(OUT_SHAPE, np.float32))


def _enhanced(stored: np.ndarray, pvt: dict[str, object] | None, *, shared: bool, **top: object) -> bytes:
    frames = np.stack([stored, stored])
    ds = make_dataset(pixels=frames, NumberOfFrames=2, sop_class=EnhancedCTImageStorage, **top)
    item = Dataset()
    if pvt is not None:
        values = Dataset()
        for key, value in pvt.items():
            setattr(values, key, value)
        item.PixelValueTransformationSequence = [values]
    if shared:
        ds.SharedFunctionalGroupsSequence = [item]
    else:
        ds.PerFrameFunctionalGroupsSequence = [item, item]
    return to_bytes(ds)


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-frame"])
def test_an_enhanced_ct_whose_rescale_item_has_no_intercept_is_refused(pipeline, shared: bool) -> None:
    stored = _stored()
    _run(pipeline, _enhanced(stored, {"RescaleSlope": 1, "RescaleIntercept": -1024, "RescaleType": "HU"},
                             shared=shared))  # the item has it: scored
    for pvt, top in (({"RescaleSlope": 1, "RescaleType": "HU"}, {}),  # slope only
                     ({"RescaleType": "HU"}, {}),  # an item without either
                     ({"RescaleSlope": 1}, {"RescaleIntercept": -1024})):  # the top-level copy is not the item's
        with pytest.raises(DicomError, match=r"\(0028,1052\) Rescale Intercept is missing"):
            _run(pipeline, _enhanced(stored, pvt, shared=shared, **top))


def test_a_signed_jpeg2000_stream_under_an_unsigned_header_is_refused(pipeline) -> None:
    stored = _stored()

    def j2k(stream: np.ndarray, bits: int, **tags: object) -> bytes:
        ds = make_dataset(pixels=stored if not tags.get("PixelRepresentation") else stored.astype(np.int16),
                          bits_stored=bits, RescaleSlope=1, RescaleIntercept=-1024, **tags)
        ds.PixelData = encapsulate([bytes(openjpeg.encode(stream, bits_stored=bits))])
        ds["PixelData"].VR = "OB"
        ds["PixelData"].is_undefined_length = True
        ds.file_meta.TransferSyntaxUID = JPEG2000Lossless
        return to_bytes(ds)

    shifted = (stored.astype(np.int32) - 2048).astype(np.int16)  # the same values, signed: pydicom read 2048..3904
    with pytest.raises(DicomError, match=r"the J2K SIZ says component 0's samples are signed, but \(0028,0103\) "
                                         r"Pixel Representation = 0 says unsigned"):
        _run(pipeline, j2k(shifted, 12))
    _run(pipeline, j2k(stored, 12))  # unsigned under unsigned: scored
    _run(pipeline, j2k(stored, 12, PixelRepresentation=1, HighBit=11))  # unsigned stream, signed header: corrected


def test_a_modality_lut_on_a_ct_is_refused(pipeline) -> None:
    item = Dataset()
    item.add_new(0x00283002, "US", [4096, 0, 16])  # 4096 entries from stored value 0, 16 bits
    item.add_new(0x00283006, "US", list(range(4096)))  # the identity: no value below 0 "HU"
    item.ModalityLUTType = "HU"
    data = to_bytes(make_dataset(pixels=_stored(), ModalityLUTSequence=[item]))
    with pytest.raises(DicomError, match=r"\(0028,3000\) Modality LUT Sequence in a CT image: its \(0028,3006\) LUT "
                                         r"Data is unsigned, so it cannot give Hounsfield units below 0"):
        _run(pipeline, data)


@pytest.mark.parametrize(("slope", "intercept", "refused"), [
    (1.0, -1024.0, False), (0.5, -1024.0, False), (1.0, -32768.0, False),
    (1e30, -1024.0, True), (1.0, 1e38, True), (-1e6, 0.0, True)])
def test_a_ct_rescale_that_cannot_give_hounsfield_units_is_refused(pipeline, slope: float, intercept: float,
                                                                    refused: bool) -> None:
    data = to_bytes(make_dataset(pixels=_stored(), RescaleSlope=slope, RescaleIntercept=intercept))
    if not refused:
        _run(pipeline, data)
        return
    with pytest.raises(DicomError, match=r"\(0028,1053\) Rescale Slope = .* outside any Hounsfield scale"):
        _run(pipeline, data)


@pytest.mark.parametrize("keyword", ["RescaleIntercept", "RescaleSlope"])
def test_a_multi_valued_rescale_is_refused(pipeline, keyword: str) -> None:
    tags = {"RescaleSlope": 1, "RescaleIntercept": -1024, keyword: [-1024, 0] if keyword == "RescaleIntercept"
            else [1, 2]}
    with pytest.raises(DicomError, match=rf"{keyword[:7]} {keyword[7:]} has 2 values; it takes exactly one"):
        _run(pipeline, to_bytes(make_dataset(pixels=_stored(), **tags)))


@pytest.mark.parametrize(("rows", "columns", "words"), [
    (1, 512, "smaller than pipeline"), (512, 1, "smaller than pipeline"), (32, 32, "smaller than pipeline"),
    (64, 512, "8 times longer than it is wide"), (2, 4096, "smaller than pipeline")])
def test_an_image_too_small_or_too_long_for_the_model_is_not_applicable(pipeline, rows: int, columns: int,
                                                                         words: str) -> None:
    pixels = np.full((rows, columns), 1024, np.uint16)
    data = to_bytes(make_dataset(pixels=pixels, RescaleSlope=1, RescaleIntercept=-1024))
    with pytest.raises(NotApplicable, match=rf"\(0028,0010\) Rows x \(0028,0011\) Columns = {rows} x {columns} is "
                                            rf".*{words}"):
        _run(pipeline, data)


@pytest.mark.parametrize(("rows", "columns"), [(64, 64), (128, 512), (512, 512)])
def test_a_small_or_oblong_slice_within_the_bounds_is_scored(pipeline, rows: int, columns: int) -> None:
    pixels = np.full((rows, columns), 1024, np.uint16)
    _run(pipeline, to_bytes(make_dataset(pixels=pixels, RescaleSlope=1, RescaleIntercept=-1024)))
