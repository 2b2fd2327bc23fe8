"""Decode a plain reversible JPEG 2000 frame at half resolution: the 5/3 wavelet's level-1 low-pass band.

A JPEG 2000 decoder that stops one wavelet level early skips most of the work (the largest level holds three
quarters of the coefficients) and returns the low-pass band, a half-size image. For the reversible 5/3 wavelet
that band is exact: the integer lifting of the encoder's first level, whatever the levels above it. The model
input built from it differs a little from the area-resize contract (docs/dicom.md, "JPEG 2000 at the model's
resolution"), so a pipeline uses it only when its model's manifest says the model was validated on it.

Pillow's OpenJPEG decoder is the one installed that can stop early (``Image.reduce``). It returns samples of 9
to 16 bits as unsigned 16-bit values shifted left to fill 16 bits, with signed data offset by half the range;
:func:`decode_j2k_lowpass` undoes both, so it returns stored values as pydicom's full decode would.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, Jpeg2KImagePlugin  # registered at import: the workers' fork server preloads it

__all__ = ["decode_j2k_lowpass"]


def decode_j2k_lowpass(frame: bytes, precision: int, signed: bool) -> np.ndarray:
    """Return a JPEG 2000 frame's level-1 low-pass band: int32 stored values, ``ceil(rows / 2) x ceil(cols / 2)``.

    Args:
        frame: one whole frame that :func:`appliance.dicom.codestream.j2k_reversible_levels` accepts.
        precision: the codestream's sample precision, 9 to 16 bits (the DICOM Bits Stored).
        signed: the codestream's samples are signed (the DICOM Pixel Representation is 1).

    Raises:
        OSError, ValueError, SyntaxError: Pillow could not decode the frame (the caller names the tag).
    """
    if not 9 <= precision <= 16:
        raise ValueError(f"precision {precision} is outside the 9..16 bits this path reads")
    with Image.open(io.BytesIO(frame), formats=("JPEG2000",)) as im:
        if not isinstance(im, Jpeg2KImagePlugin.Jpeg2KImageFile) or im.mode != "I;16":
            raise ValueError(f"the decoder read the frame as mode {im.mode!r}, not one 16-bit channel")
        im.reduce = 1  # the plugin's property shadows Image.reduce()
        im.load()
        out = np.asarray(im).astype(np.int32)
    out >>= 16 - precision
    if signed:
        out -= 1 << (precision - 1)
    return out
