"""Does an 8-bit JPEG frame's entropy-coded data run to its end? Checked with libjpeg-turbo's strict mode.

A JPEG frame that lost bytes from its middle (a dropped fragment, a cut that kept the FFD9 end marker) still passes
the header checks (:mod:`appliance.dicom.codestream`), and Pillow and pylibjpeg decode it without an error: libjpeg
reports "premature end of data segment" as a *warning* and fills the rest of the image. Pillow drops libjpeg's
warnings, so this module decodes the frame once more with simplejpeg (libjpeg-turbo, ``strict=True``: warnings
raise) and refuses the frame on the warnings that mean lost or corrupt data (docs/robustness.md).

Only 8-bit baseline and lossless frames can be checked this way: libjpeg-turbo's simplejpeg interface has no 12- or
16-bit path ("Unsupported JPEG data precision"), and such frames keep the decoder's own verdict.
"""

from __future__ import annotations

__all__ = ["LOST_DATA", "jpeg_data_lost"]

#: libjpeg's warnings that mean the image is not what was encoded (jerror.h: JWRN_HIT_MARKER, JWRN_JPEG_EOF and the
#: Huffman ones). "extraneous bytes before marker" is not among them: some writers pad between segments.
LOST_DATA = ("premature end of data segment", "premature end of jpeg file", "bad huffman code",
             "huffman code size table overflow", "invalid arithmetic code")


def jpeg_data_lost(frame: bytes, samples: int) -> str | None:
    """Return libjpeg-turbo's warning when ``frame`` decodes only by filling in lost data, else None.

    Args:
        frame: one whole JPEG frame (SOI .. EOI).
        samples: the DICOM header's Samples per Pixel (1 decodes to grey, else to RGB).
    """
    import simplejpeg  # imported on first use: only the workers decode

    try:
        simplejpeg.decode_jpeg(frame, colorspace="GRAY" if samples == 1 else "RGB", strict=True)
    except ValueError as e:
        text = str(e)
        if any(warning in text.lower() for warning in LOST_DATA):
            return text
    return None
