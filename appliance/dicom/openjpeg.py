"""Plain greyscale JPEG 2000 frames through Pillow's OpenJPEG: in full, or one wavelet level short, on idle cores.

Pillow's OpenJPEG decoder does two things pydicom's pylibjpeg plugin cannot (docs/dicom.md, "JPEG 2000"):

* **Stop one wavelet level early** (``Image.reduce``). The largest level holds three quarters of the coefficients,
  so the decode skips most of the work and returns the low-pass band, a half-size image. For the reversible 5/3
  wavelet that band is exact: the integer lifting of the encoder's first level, whatever the levels above it. The
  model input built from it differs a little from the area-resize contract (docs/dicom.md, "JPEG 2000 at the
  model's resolution"), so a pipeline uses it only when its model's manifest says the model was validated on it.
* **Decode one frame on several cores.** OpenJPEG splits a tile's code-blocks across a thread pool whose size it
  reads from ``OPJ_NUM_THREADS`` each time a decoder is created. The pixels do not depend on the thread count.
  :func:`set_decoder_threads` sets it; a worker process does, per frame, with the cores the daemon says are idle
  (docs/performance.md, "Decoder threads").

Pillow returns samples of 9 to 16 bits as unsigned 16-bit values shifted left to fill 16 bits, with signed data
offset by half the range; :func:`decode_j2k_grey` undoes both, so it returns stored values as pydicom's decode
would. Only frames that :func:`appliance.dicom.codestream.j2k_reversible_levels` accepts come here; for those the
output equals pylibjpeg-openjpeg's, value for value (``tests/unit/test_openjpeg.py``).
"""

from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image, Jpeg2KImagePlugin  # registered at import: the workers' fork server preloads it

__all__ = ["decode_j2k_grey", "decode_j2k_lowpass", "set_decoder_threads"]

_THREADS_ENV = "OPJ_NUM_THREADS"


def set_decoder_threads(threads: int) -> None:
    """Let each JPEG 2000 decode from now on in this process use ``threads`` threads (1: the calling thread only).

    Process-wide (an environment variable that OpenJPEG reads when a decoder is created): only a worker process,
    which decodes one frame at a time, and the bench's cost phase call it. For one thread the variable is removed:
    ``OPJ_NUM_THREADS=1`` makes OpenJPEG decode on one pool thread of its own while the caller waits, which
    hides the decode's CPU from the caller's thread CPU time.
    """
    if threads <= 1:
        os.environ.pop(_THREADS_ENV, None)
    elif os.environ.get(_THREADS_ENV) != str(threads):
        os.environ[_THREADS_ENV] = str(threads)


def decode_j2k_grey(frame: bytes, precision: int, signed: bool, reduce: int = 0) -> np.ndarray:
    """Return a greyscale JPEG 2000 frame as int32 stored values, in full or ``reduce`` wavelet levels short.

    Args:
        frame: one whole frame that :func:`appliance.dicom.codestream.j2k_reversible_levels` accepts.
        precision: the codestream's sample precision, 9 to 16 bits (the DICOM Bits Stored).
        signed: the codestream's samples are signed (the DICOM Pixel Representation is 1).
        reduce: 0 for the whole image; 1 for the level-1 low-pass band, ``ceil(rows / 2) x ceil(cols / 2)``.

    Raises:
        OSError, ValueError, SyntaxError: Pillow could not decode the frame (the caller names the tag).
    """
    if not 9 <= precision <= 16:
        raise ValueError(f"precision {precision} is outside the 9..16 bits this path reads")
    with Image.open(io.BytesIO(frame), formats=("JPEG2000",)) as im:
        if not isinstance(im, Jpeg2KImagePlugin.Jpeg2KImageFile) or im.mode != "I;16":
            raise ValueError(f"the decoder read the frame as mode {im.mode!r}, not one 16-bit channel")
        if reduce:
            im.reduce = reduce  # the plugin's property shadows Image.reduce()
        im.load()
        out = np.asarray(im).astype(np.int32)
    out >>= 16 - precision
    if signed:
        out -= 1 << (precision - 1)
    return out


def decode_j2k_lowpass(frame: bytes, precision: int, signed: bool) -> np.ndarray:
    """Return a JPEG 2000 frame's level-1 low-pass band (:func:`decode_j2k_grey` with ``reduce=1``)."""
    return decode_j2k_grey(frame, precision, signed, reduce=1)
