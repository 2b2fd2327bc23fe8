"""Plain greyscale JPEG 2000 frames decoded in full through Pillow's OpenJPEG, on as many threads as they are given.

The reference is pydicom's pylibjpeg-openjpeg plugin, which decodes every other JPEG 2000 frame: on the frames
that take Pillow's path the two must agree value for value and in dtype, corrupt ones included, whatever the
thread count.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import numpy as np
import pytest
from pydicom.pixels import get_decoder
from test_lowpass import codestream, corrupt_j2k_file, j2k_file, smooth

import appliance.dicom.instance as instance_module
from appliance.dicom import DicomInstance, parse
from appliance.dicom.openjpeg import decode_j2k_grey, set_decoder_threads
from appliance.errors import DicomError


def pylibjpeg(inst: DicomInstance, index: int) -> np.ndarray:
    """Frame ``index`` as pydicom's pylibjpeg plugin decodes it (the path every other J2K frame takes)."""
    arr, _ = get_decoder(inst.transfer_syntax_uid).as_array(
        inst._pixels, index=index, validate=True, raw=True, decoding_plugin="pylibjpeg", **inst._opts)
    return arr


@pytest.fixture
def pillow_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the frames that went through Pillow's full decode."""
    calls: list[int] = []

    def spy(frame: bytes, precision: int, signed: bool, reduce: int = 0) -> np.ndarray:
        calls.append(reduce)
        return decode_j2k_grey(frame, precision, signed, reduce)

    monkeypatch.setattr(instance_module, "decode_j2k_grey", spy)
    return calls


@pytest.fixture(autouse=True)
def _one_thread_after() -> object:
    yield
    set_decoder_threads(1)


@pytest.mark.parametrize(("shape", "bits", "signed"),
                         [((64, 64), 12, False), ((37, 50), 16, True), ((65, 33), 12, True), ((40, 42), 16, False)])
def test_a_plain_grey_frame_decodes_through_pillow_to_the_stored_values(shape, bits, signed, pillow_calls):
    stored = smooth(shape, bits, signed)
    inst = parse(j2k_file(stored, bits))
    out = inst.decode_frame(0)
    assert pillow_calls == [0]
    np.testing.assert_array_equal(out, stored)
    reference = pylibjpeg(inst, 0)
    assert out.dtype == reference.dtype and out.shape == reference.shape
    np.testing.assert_array_equal(out, reference)


def test_every_frame_of_a_multiframe_takes_the_path(pillow_calls):
    frames = np.stack([smooth((48, 40), 12, False, seed=s) for s in (1, 2, 3)])
    inst = parse(j2k_file(frames, 12, frames=3))
    for i in range(3):
        np.testing.assert_array_equal(inst.decode_frame_raw(i)[0], frames[i])
    assert pillow_calls == [0, 0, 0]


@pytest.mark.parametrize(("name", "pillow"), [
    ("MR_small_jp2klossless.dcm", True),  # another encoder's reversible stream, signed 16-bit
    ("693_J2KI.dcm", False),  # irreversible 9/7: pylibjpeg
    ("J2K_pixelrep_mismatch.dcm", False),  # the codestream's sign disagrees with Pixel Representation: pylibjpeg
])
def test_files_from_other_encoders(name, pillow, pillow_calls):
    from pydicom.data import get_testdata_file

    path = get_testdata_file(name)
    if path is None:
        pytest.skip(f"{name} is not in this pydicom's bundled test files")
    inst = parse(Path(str(path)).read_bytes())
    out = inst.decode_frame(0)
    assert bool(pillow_calls) == pillow
    if pillow:
        np.testing.assert_array_equal(out, pylibjpeg(inst, 0))
        assert out.dtype == pylibjpeg(inst, 0).dtype


def test_more_threads_give_the_same_values():
    stored = smooth((512, 512), 16, True, seed=7)
    cs = codestream(stored, 16)
    set_decoder_threads(1)
    one = decode_j2k_grey(cs, 16, True)
    set_decoder_threads(2)
    assert os.environ["OPJ_NUM_THREADS"] == "2"
    thread0, process0 = time.thread_time(), time.process_time()
    two = decode_j2k_grey(cs, 16, True)
    assert time.thread_time() - thread0 < 0.9 * (time.process_time() - process0)  # other threads decoded too
    np.testing.assert_array_equal(two, one)
    np.testing.assert_array_equal(one, stored)
    set_decoder_threads(0)
    assert "OPJ_NUM_THREADS" not in os.environ  # never fewer than one: the caller's own thread


def test_one_thread_decodes_on_the_calling_thread():
    """``OPJ_NUM_THREADS=1`` would hand the decode to a pool thread: the bench's thread CPU time would miss it."""
    cs = codestream(smooth((512, 512), 12, False, seed=5), 12)
    os.environ["OPJ_NUM_THREADS"] = "1"  # what an operator's environment might hold
    set_decoder_threads(1)
    thread0, process0 = time.thread_time(), time.process_time()
    for _ in range(3):
        decode_j2k_grey(cs, 12, False)
    thread_s, process_s = time.thread_time() - thread0, time.process_time() - process0
    assert thread_s > 0.8 * process_s


def test_a_frame_pillow_fails_on_is_decoded_by_pylibjpeg(monkeypatch):
    def broken(frame: bytes, precision: int, signed: bool, reduce: int = 0) -> np.ndarray:
        raise OSError("decoder jpeg2k not available")  # Pillow built without OpenJPEG says this

    monkeypatch.setattr(instance_module, "decode_j2k_grey", broken)
    stored = smooth((64, 64), 12, False)
    np.testing.assert_array_equal(parse(j2k_file(stored, 12)).decode_frame(0), stored)


def test_a_corrupt_frame_fails_with_the_pylibjpeg_error():
    inst = parse(corrupt_j2k_file(smooth((128, 128), 12, False), 12))
    with pytest.raises(DicomError) as info:
        inst.decode_frame(0)
    assert info.value.field == "dicom.PixelData" and "pylibjpeg" in str(info.value)


@pytest.mark.parametrize("threads", [1, 2])
def test_damaged_codestreams_get_the_same_outcome_on_both_decoders(threads):
    """Bit flips in the coded data: whatever pylibjpeg makes of a frame, so does this path.

    OpenJPEG decodes damaged code-blocks leniently, so these frames decode (to damaged values) in both builds;
    the check is that the two builds, on one thread or two, produce the same values.
    """
    set_decoder_threads(threads)
    stored = smooth((96, 80), 12, True, seed=11)
    clean = codestream(stored, 12)
    sod = clean.index(b"\xff\x93") + 2
    rng = random.Random(threads)
    for _ in range(40):
        cs = bytearray(clean)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(sod, len(cs) - 2)
            cs[pos] ^= 1 << rng.randrange(8)
        inst = parse(j2k_file(stored, 12, cs=bytes(cs)))
        try:
            expected: np.ndarray | None = pylibjpeg(inst, 0)
        except Exception:  # noqa: BLE001 - any decoder failure
            expected = None
        if expected is None:
            with pytest.raises(DicomError):
                inst.decode_frame(0)
        else:
            np.testing.assert_array_equal(inst.decode_frame(0), expected)
