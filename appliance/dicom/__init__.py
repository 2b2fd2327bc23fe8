"""DICOM Part 10 in: bounded parsing and validation, codestream checks, and frame decoding (docs/dicom.md).

- :mod:`.reader`: :func:`parse`, the wall between network bytes and the pipelines (limits first, no ``force``);
- :mod:`.pixels`: the image pixel module, cross-checked against itself and the pixel data length;
- :mod:`.instance`: the validated :class:`DicomInstance`, which decodes one frame at a time;
- :mod:`.codestream`: JPEG, JPEG-LS, JPEG 2000 and RLE headers checked before any decoder runs;
- :mod:`.streamend`: where a frame's codestream ends, so that no second codestream hides after it;
- :mod:`.syntaxes`: one decoder plugin per transfer syntax, and the tag names in every message.

The public names are re-exported here: ``from appliance.dicom import parse, DicomInstance``.
"""

from appliance.dicom.instance import DicomInstance, DicomLimits
from appliance.dicom.reader import parse
from appliance.dicom.syntaxes import DECODER_PLUGINS, NATIVE, decoder_report, tag_name

__all__ = ["DECODER_PLUGINS", "NATIVE", "DicomInstance", "DicomLimits", "decoder_report", "parse", "tag_name"]
