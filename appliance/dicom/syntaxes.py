"""Which decoder plugin decodes which transfer syntax, and the names every DICOM error message uses.

One plugin per transfer syntax, never pydicom's "auto" chain (docs/dicom.md): a fallback turns a loud
decoder failure into silently wrong pixels from the next plugin. :func:`decoder_report` tells
``appliance doctor`` and the startup log which plugins are usable here.
"""

from __future__ import annotations

from typing import Any

from pydicom import uid as _uid
from pydicom.datadict import dictionary_description, tag_for_keyword
from pydicom.pixels import get_decoder

from appliance.errors import UnsupportedTransferSyntax
from appliance.privacy import is_uid, redact_foreign

__all__ = ["DECODER_PLUGINS", "LOSSY_SYNTAXES", "MODALITIES", "NATIVE", "check_syntax", "decoder_report",
           "defined_term", "first_line", "plugin_status", "tag_label", "tag_name", "ts_label", "uid_label"]

NATIVE = "native"
"""Pseudo plugin name for the uncompressed syntaxes, decoded by pydicom's numpy-only native decoder."""

# NOTE(dicom): one plugin per transfer syntax, never "auto" (docs/dicom.md): a fallback chain turns a
# loud failure (pyjpegls: "Invalid JPEG-LS stream") into silently wrong pixels from the next plugin.
DECODER_PLUGINS: dict[str, str] = {
    _uid.ImplicitVRLittleEndian: NATIVE,
    _uid.ExplicitVRLittleEndian: NATIVE,
    _uid.DeflatedExplicitVRLittleEndian: NATIVE,  # inflated by dcmread (bounded first, see _check_deflate)
    _uid.ExplicitVRBigEndian: NATIVE,
    _uid.RLELossless: "pylibjpeg",  # pylibjpeg-rle: ~7x faster than pydicom's numpy RLE
    _uid.JPEGBaseline8Bit: "pillow",  # 3x faster than pylibjpeg; agrees with gdcm on lossy output
    _uid.JPEGExtended12Bit: "pylibjpeg",  # the only installed plugin that decodes 12-bit
    _uid.JPEGLossless: "pylibjpeg",  # gdcm would be ~2x faster but is 43 MB; not shipped
    _uid.JPEGLosslessSV1: "pylibjpeg",
    _uid.JPEGLSLossless: "pyjpegls",  # fastest, and fails loudly on corrupt streams
    _uid.JPEGLSNearLossless: "pyjpegls",
    _uid.JPEG2000Lossless: "pylibjpeg",  # openjpeg: handles YBR_RCT, fastest on small/colour images
    _uid.JPEG2000: "pylibjpeg",
    _uid.HTJ2KLossless: "pylibjpeg",  # openjpeg is the only HTJ2K decoder pydicom knows
    _uid.HTJ2KLosslessRPCL: "pylibjpeg",
    _uid.HTJ2K: "pylibjpeg",
}

LOSSY_SYNTAXES = frozenset(
    {_uid.JPEGBaseline8Bit, _uid.JPEGExtended12Bit, _uid.JPEGLSNearLossless, _uid.JPEG2000, _uid.HTJ2K}
)

#: (0008,0060) Modality defined terms, current and retired (PS3.3 C.7.3.1.1.1): the only values a message quotes.
MODALITIES = frozenset(
    "AR ASMT AU BDUS BI BMD CFM CR CT CTPROTOCOL DG DMS DOC DX ECG EEG EMG EOG EPS ES FID GM HC HD IO IOL IVOCT "
    "IVUS KER KO LEN LS M3D MG MR NM OAM OCT OP OPM OPT OPTBSV OPTENF OPV OSS OT PA PLAN POS PR PT PX REG RESP RF "
    "RG RTDOSE RTIMAGE RTINTENT RTPLAN RTRAD RTRECORD RTSEGANN RTSTRUCT RWV SEG SM SMR SR SRF STAIN TEXTUREMAP TG "
    "US VA XA XAPROTOCOL XC AS CD CF CP CS DD DF DM DS EC FA FS LP MA MS OPR ST VF".split()
)


def defined_term(value: str, terms: frozenset[str] | dict[str, int]) -> str:
    """Quote a coded element value for a message only when it is one of the standard's ``terms``.

    Anything else in a coded element (a writer's typo, or text placed there on purpose) could be patient data, and
    messages never quote element values that could be (docs/dicom.md).
    """
    return repr(value) if value in terms else "(empty)" if not value else "(not a defined term)"


def tag_name(keyword: str) -> str:
    """Return ``"(gggg,eeee) Name"`` for a DICOM keyword, the form every error message uses.

    Args:
        keyword: a DICOM data dictionary keyword such as ``"Rows"``.
    """
    tag = tag_for_keyword(keyword)
    if tag is None:
        return keyword
    return tag_label(tag)


def tag_label(tag: int) -> str:
    """Return ``"(gggg,eeee) Name"`` for a tag number; elements the dictionary lacks are named as such.

    Repeating groups (curves 50xx, overlays 60xx) are in the dictionary under a mask: (6000,3000) is Overlay Data.
    """
    try:
        name = dictionary_description(tag)
    except KeyError:
        name = "a private or unknown element"
    return f"({tag >> 16:04X},{tag & 0xFFFF:04X}) {name}"


#: Transfer syntaxes added to PS3.6 after the pydicom release in use (pydicom names them by their UID alone): a
#: refusal should say what the file is, e.g. not leave Deflated Image Frame Compression to be confused with the
#: accepted Deflated Explicit VR Little Endian (a held-out corpus, session 24).
_NEWER_NAMES = {
    "1.2.840.10008.1.2.8.1": "Deflated Image Frame Compression",
    "1.2.840.10008.1.2.4.110": "JPEG XL Lossless",
    "1.2.840.10008.1.2.4.111": "JPEG XL JPEG Recompression",
    "1.2.840.10008.1.2.4.112": "JPEG XL",
}


def uid_label(uid: str) -> str:
    """Return a UID as ``'Name' (uid)`` for messages, or ``'uid'`` when neither pydicom nor we have a name for it.

    A value that is not UID syntax (digits and dots, at most 64 characters) is not quoted: any text can sit in
    the element, including patient data.
    """
    if not is_uid(uid):
        return "(not a valid UID)"
    value = _uid.UID(uid)
    name = value.name if value.name and value.name != uid else _NEWER_NAMES.get(uid)
    return f"'{name}' ({uid})" if name else f"'{uid}'"


def ts_label(ts: str) -> str:
    """Return a transfer syntax as ``'Name' (uid)`` for messages (see :func:`uid_label`)."""
    return uid_label(ts)


def first_line(e: BaseException) -> str:
    """Return the first lines of an exception's text, at most 300 characters (for error messages)."""
    # Foreign messages may quote element values (patient data): redacted (appliance.privacy.redact_foreign).
    text = str(e).strip().splitlines()
    return redact_foreign(" ".join(line.strip() for line in text[:3]))[:300] if text else ""

def decoder_report() -> dict[str, dict[str, Any]]:
    """Return, per accepted transfer syntax UID, the chosen plugin and whether it can be used here.

    Each value is ``{"name": ..., "plugin": ..., "available": bool, "missing": str | None, "others": [...]}``
    where ``missing`` is pydicom's own text such as ``"pyjpegls - requires pyjpegls"`` and ``others`` lists
    the installed plugins deliberately not used. For ``appliance doctor`` and the startup log.
    """
    report: dict[str, dict[str, Any]] = {}
    for ts, plugin in DECODER_PLUGINS.items():
        report[ts] = plugin_status(ts, plugin)
    return report


def plugin_status(ts: str, plugin: str) -> dict[str, Any]:
    """Return ``decoder_report``'s entry for one transfer syntax and its chosen plugin."""
    entry: dict[str, Any] = {"name": _uid.UID(ts).name, "plugin": plugin, "available": True, "missing": None}
    try:
        decoder = get_decoder(ts)
    except NotImplementedError:
        entry.update(available=False, missing="pydicom has no decoder for this transfer syntax", others=[])
        return entry
    if plugin == NATIVE:
        entry["others"] = []
        return entry
    available = list(decoder.available_plugins)
    entry["others"] = [p for p in available if p != plugin]
    if plugin not in available:
        missing = [m for m in decoder.missing_dependencies if m.startswith(f"{plugin} ")]
        entry.update(available=False, missing=missing[0] if missing else f"{plugin} - plugin not registered")
    return entry

def check_syntax(ts: str) -> None:
    """Raise UnsupportedTransferSyntax unless ``ts`` is accepted and its plugin is usable here."""
    plugin = DECODER_PLUGINS.get(ts)
    if plugin is None:
        accepted = ", ".join(sorted(_uid.UID(u).name for u in DECODER_PLUGINS))
        raise UnsupportedTransferSyntax(
            f"{tag_name('TransferSyntaxUID')} {ts_label(ts)} is not accepted; accepted: {accepted}",
            field="dicom.TransferSyntaxUID",
        )
    status = plugin_status(ts, plugin)
    if not status["available"]:
        raise UnsupportedTransferSyntax(
            f"{tag_name('TransferSyntaxUID')} {ts_label(ts)} needs decoder plugin {plugin!r}, which is not "
            f"usable here: {status['missing']}",
            field="dicom.TransferSyntaxUID",
        )
