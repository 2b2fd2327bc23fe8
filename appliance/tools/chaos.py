"""Hostile inputs for the front door, and ``appliance chaos``: a bounded run against a real daemon.

:func:`bad_cases` builds a corpus of generated bad inputs, each with the gRPC status codes it may end with:
truncation at many offsets (inside compressed frames too), bytes flipped in every codec's stream, stream
dimensions that lie, deflate and sequence bombs, lying lengths, non-image SOP classes, not DICOM, empty input.
:func:`fault_case` builds an input that makes a worker segfault, abort, panic, allocate without bound or spin
(only when the daemon runs with ``APPLIANCE_TEST_DECODER_FAULTS=1``, a test-only switch).

``appliance chaos --duration S`` starts a daemon with faults enabled, sends a random mix of valid files, bad
cases and faults from several clients for S seconds, and reports inputs tried, faults injected, accepted requests
lost (must be 0), replies by status code, worker restarts and peak RSS (daemon plus workers). docs/robustness.md
has the expected outcome of each case.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import io
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import pydicom
from pydicom import uid as _uid
from pydicom.filereader import _read_file_meta_info, read_preamble

from appliance.tools import synthetic
from appliance.workers.child import FAULT_ROOT, FAULTS

__all__ = ["ANY_PIPELINE", "Case", "bad_cases", "fault_case", "main", "valid_files"]

OK, INVALID, PRECONDITION, EXHAUSTED, DEADLINE = (
    "OK", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")
CLIENT_ERRORS = frozenset({INVALID, PRECONDITION})

# A pipeline for the model that accepts any grey or colour image (luminance), so codecs that only come in colour
# or non-CT test files (JPEG) still reach the decoder. Tests and chaos runs write it next to the real pipelines.
ANY_PIPELINE = """format_version = 1
name = "any"
model = "ct-nodule"
[accept]
colour = "luminance"
[[steps]]
name = "modality_lut"
[[steps]]
name = "window"
center = -600.0
width = 1500.0
[[steps]]
name = "invert_monochrome1"
[[steps]]
name = "resize"
[[steps]]
name = "normalize"
"""


@dataclass(frozen=True)
class Case:
    """One input and the status codes it may end with."""

    name: str
    data: bytes
    expect: frozenset[str]
    pipeline: str = ""  # "" = the default pipeline


def valid_files(size: int = 128, seed: int = 7) -> dict[str, bytes]:
    """One small synthetic CT slice per transfer syntax the project can encode (transfer syntax UID -> bytes)."""
    truth = synthetic.generate_slice(seed, size=size)
    return {ts: synthetic.to_dicom(truth, transfer_syntax=ts) for ts in synthetic.TRANSFER_SYNTAXES}


def _jpeg_samples() -> dict[str, bytes]:
    """Pydicom's bundled JPEG files (baseline, extended 12-bit, lossless): no JPEG encoder is installed."""
    from pydicom.data import get_testdata_file

    out = {}
    for name in ("SC_rgb_jpeg_dcmtk.dcm", "JPGExtended.dcm", "SC_rgb_jpeg_gdcm.dcm"):
        path = get_testdata_file(name)
        if path is not None:
            out[name] = Path(str(path)).read_bytes()
    return out


def _pixel_span(data: bytes) -> tuple[int, int]:
    """Return (start, end) of the Pixel Data value (the encapsulated item stream for compressed syntaxes)."""
    for tag in (b"\xe0\x7f\x10\x00OB\x00\x00", b"\xe0\x7f\x10\x00OW\x00\x00", b"\x7f\xe0\x00\x10OW\x00\x00"):
        at = data.rfind(tag)
        if at >= 0:
            return at + 12, len(data)
    at = data.rfind(b"\xe0\x7f\x10\x00")  # implicit VR
    return (at + 8, len(data)) if at >= 0 else (len(data) // 2, len(data))


def _first_fragment(data: bytes) -> int:
    """Offset of the first fragment's bytes after the Basic Offset Table item."""
    start, _ = _pixel_span(data)
    (bot_len,) = struct.unpack_from("<I", data, start + 4)
    return start + 8 + int(bot_len) + 8


def _lie_dimensions(ts: str, data: bytes) -> bytes | None:
    """Make the codestream claim 20000 x 20000 while the DICOM header keeps its Rows/Columns."""
    buf = bytearray(data)
    frag = _first_fragment(data)
    if ts in (_uid.JPEGLSLossless, _uid.JPEGLSNearLossless):
        at = data.find(b"\xff\xf7", frag)
        struct.pack_into(">HH", buf, at + 5, 20000, 20000)
    elif ts == _uid.JPEG2000Lossless:
        at = data.find(b"\xff\x4f\xff\x51", frag)
        struct.pack_into(">II", buf, at + 8, 20000, 20000)
    elif ts == _uid.RLELossless:
        struct.pack_into("<I", buf, frag, 7)  # seven segments for one 16-bit sample
    else:
        return None
    return bytes(buf)


def _deflate_with_tail(valid_deflated: bytes, tail: bytes) -> bytes:
    """Re-deflate a deflated file's body with ``tail`` appended (a private element after Pixel Data)."""
    fp = io.BytesIO(valid_deflated)
    read_preamble(fp, False)
    _read_file_meta_info(fp)
    meta_end = fp.tell()
    body = zlib.decompress(valid_deflated[meta_end:], -zlib.MAX_WBITS) + tail
    co = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return valid_deflated[:meta_end] + co.compress(body) + co.flush()


def _private_sq(items: int) -> bytes:
    """(7FE1,0010) creator + (7FE1,1001) SQ of undefined length holding ``items`` empty items."""
    creator = b"\xe1\x7f\x10\x00LO\x04\x00EDGE"
    seq = b"\xe1\x7f\x01\x10SQ\x00\x00\xff\xff\xff\xff"
    return creator + seq + b"\xfe\xff\x00\xe0\x00\x00\x00\x00" * items + b"\xfe\xff\xdd\xe0\x00\x00\x00\x00"


def _private_ob(n: int) -> bytes:
    creator = b"\xe1\x7f\x10\x00LO\x04\x00EDGE"
    return creator + b"\xe1\x7f\x02\x10OB\x00\x00" + struct.pack("<I", n) + bytes(n)


def _non_image() -> bytes:
    ds = pydicom.Dataset()
    ds.SOPClassUID = _uid.BasicTextSRStorage
    ds.SOPInstanceUID = _uid.generate_uid()
    ds.Modality = "SR"
    meta = pydicom.dataset.FileMetaDataset()
    meta.MediaStorageSOPClassUID = ds.SOPClassUID
    meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    meta.TransferSyntaxUID = _uid.ExplicitVRLittleEndian
    ds.file_meta = meta
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


def _stream_cases(rng: random.Random, label: str, ts: str, data: bytes, truncations: int, flips: int,
                  pipeline: str = "") -> list[Case]:
    """Truncations (header, pixel data, inside a compressed frame before its EOI) and bit flips of one valid file."""
    cases = []
    start, end = _pixel_span(data)
    compressed = _uid.UID(ts).is_encapsulated
    for k in range(truncations):
        cut = rng.randrange(132, len(data) - 4) if k < truncations // 2 else rng.randrange(start, end - 4)
        strictly_inside = compressed and cut < end - 4 and cut > start + 16
        expect = frozenset({INVALID, PRECONDITION}) if (strictly_inside or not compressed) else frozenset(
            {OK, INVALID, PRECONDITION})
        if not compressed and cut >= start:
            expect = frozenset({INVALID})
        cases.append(Case(f"truncate-{label}-{cut}", data[:cut], expect, pipeline=pipeline))
    for k in range(flips):  # corrupt bytes in the stream: an error wherever the codec can tell
        buf = bytearray(data)
        lo = _first_fragment(data) + 8 if compressed else start
        for at in rng.sample(range(lo, end - 2), 16):
            buf[at] ^= 1 << rng.randrange(8)
        cases.append(Case(f"flip-{label}-{k}", bytes(buf), frozenset({OK, INVALID}), pipeline=pipeline))
    return cases


def bad_cases(seed: int = 0, *, truncations: int = 6, flips: int = 4, size: int = 128) -> list[Case]:
    """The generated corpus of hostile inputs (deterministic for a seed)."""
    rng = random.Random(seed)
    valid = valid_files(size, seed=seed + 7)
    cases: list[Case] = [
        Case("empty", b"", frozenset({INVALID})),
        Case("not-dicom-text", b"hello, this is not DICOM\n" * 20, frozenset({INVALID})),
        Case("not-dicom-png", b"\x89PNG\r\n\x1a\n" + bytes(rng.randrange(256) for _ in range(600)),
             frozenset({INVALID})),
        Case("preamble-then-garbage", bytes(128) + b"DICM" + bytes(rng.randrange(256) for _ in range(400)),
             frozenset({INVALID})),
        Case("non-image-sr", _non_image(), frozenset({PRECONDITION})),
    ]
    for ts, data in valid.items():
        label = _uid.UID(ts).keyword or ts
        cases += _stream_cases(rng, label, ts, data, truncations, flips)
        lie = _lie_dimensions(ts, data)
        if lie is not None:
            cases.append(Case(f"dimension-lie-{label}", lie, frozenset({INVALID})))
    # The half-resolution JPEG 2000 decoder (pipeline ct-nodule-fast) sees only slices of at least twice the model
    # input: a 512 x 512 one, truncated and bit-flipped the same ways.
    big = synthetic.to_dicom(synthetic.generate_slice(seed + 7, size=512), transfer_syntax=_uid.JPEG2000Lossless)
    cases += _stream_cases(rng, "JPEG2000Lossless-512-fast", _uid.JPEG2000Lossless, big, truncations, flips,
                           pipeline="ct-nodule-fast")
    for name, data in _jpeg_samples().items():
        ts = str(pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True).file_meta.TransferSyntaxUID)
        frag = _first_fragment(data)
        sof = next(i for i in range(frag, frag + 4096) if data[i] == 0xFF and data[i + 1] in (0xC0, 0xC1, 0xC3))
        patched = bytearray(data)
        struct.pack_into(">HH", patched, sof + 5, 20000, 20000)
        cases.append(Case(f"dimension-lie-{name}", bytes(patched), frozenset({INVALID}), pipeline="any"))
        _, end = _pixel_span(data)
        cases.append(Case(f"truncate-frame-{name}", data[: (frag + end) // 2], frozenset({INVALID}), pipeline="any"))
    deflated = valid[_uid.DeflatedExplicitVRLittleEndian]
    cases.append(Case("deflate-bomb-512MiB", _deflate_with_tail(deflated, _private_ob(512 << 20)),
                      frozenset({INVALID, EXHAUSTED})))
    cases.append(Case("deflate-sequence-bomb-400k", _deflate_with_tail(deflated, _private_sq(400_000)),
                      frozenset({INVALID, EXHAUSTED})))
    native = valid[_uid.ExplicitVRLittleEndian]
    cases.append(Case("sequence-bomb-400k", native + _private_sq(400_000), frozenset({INVALID, EXHAUSTED})))
    lying = bytearray(native)
    at = native.find(b"\x08\x00\x60\x00CS")  # (0008,0060) Modality: a 2-byte length claiming 65535
    struct.pack_into("<H", lying, at + 6, 0xFFFF)
    cases.append(Case("lying-length-modality", bytes(lying), frozenset({INVALID, PRECONDITION})))
    lying = bytearray(native)
    start, _ = _pixel_span(native)
    struct.pack_into("<I", lying, start - 4, 0x7FFFFFF0)
    cases.append(Case("lying-length-pixeldata", bytes(lying), frozenset({OK, INVALID})))
    return cases


def fault_case(kind: str, size: int = 64) -> Case:
    """An input that makes a worker misbehave (``APPLIANCE_TEST_DECODER_FAULTS=1`` daemons only)."""
    code = next(c for c, k in FAULTS.items() if k == kind)
    ds = pydicom.dcmread(io.BytesIO(synthetic.to_dicom(synthetic.generate_slice(3, size=size))))
    ds.SOPInstanceUID = f"{FAULT_ROOT}.{code}"
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    expect = {
        "alloc": frozenset({EXHAUSTED}),
        "spin": frozenset({EXHAUSTED, DEADLINE}),
    }.get(kind, frozenset({INVALID}))
    return Case(f"fault-{kind}", buf.getvalue(), expect)


# ---- appliance chaos ----------------------------------------------------------------------------------------


def _rss_tree(pid: int) -> int:
    """RSS of a process and its descendants, bytes."""
    total = 0
    children = {pid}
    try:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                if int(fields[1]) in children or int(entry) == pid:
                    children.add(int(entry))
    except OSError:
        pass
    for p in children:
        try:
            with open(f"/proc/{p}/statm", "rb") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            continue
    return total


async def _drive(target: str, cases: list[Case], valid: list[bytes], duration_s: float, clients: int,
                 pid: int, p_fault: float, faults: list[Case], seed: int) -> dict[str, object]:
    import grpc

    from appliance.proto.v1 import inference_pb2 as pb
    from appliance.proto.v1 import inference_pb2_grpc as pb_grpc

    rng = random.Random(seed)
    replies: collections.Counter[str] = collections.Counter()
    unexpected: list[str] = []
    tried = injected = 0
    peak = 0
    stop_at = time.monotonic() + duration_s
    opts = [("grpc.max_send_message_length", 128 << 20), ("grpc.max_receive_message_length", 128 << 20)]
    async with grpc.aio.insecure_channel(target, options=opts) as channel:
        stub = pb_grpc.InferenceStub(channel)

        async def client() -> None:
            nonlocal tried, injected
            while time.monotonic() < stop_at:
                r = rng.random()
                if r < p_fault:
                    case = rng.choice(faults)
                    injected += 1
                elif r < 0.5:
                    case = rng.choice(cases)
                else:
                    case = Case("valid", rng.choice(valid), frozenset({OK}))
                tried += 1
                try:
                    await stub.Analyze(pb.AnalyzeRequest(dicom=case.data, pipeline=case.pipeline), timeout=20)
                    code = "OK"
                except grpc.aio.AioRpcError as e:
                    code = e.code().name
                replies[code] += 1
                if code not in case.expect:
                    unexpected.append(f"{case.name}: {code}")

        async def sampler() -> None:
            nonlocal peak
            while time.monotonic() < stop_at:
                peak = max(peak, _rss_tree(pid))
                await asyncio.sleep(0.2)

        await asyncio.gather(sampler(), *(client() for _ in range(clients)))
        status = await stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    lost = replies.get("CANCELLED", 0) + replies.get("UNKNOWN", 0) + replies.get("INTERNAL", 0)
    return {
        "inputs_tried": tried,
        "faults_injected": injected,
        "accepted_requests_lost": lost,
        "replies_by_status": dict(replies),
        "unexpected_outcomes": unexpected[:50],
        "unexpected_count": len(unexpected),
        "worker_restarts": int(status.worker_restarts),
        "peak_rss_bytes": peak,
        "final_state": status.state,
    }


def main(argv: list[str] | None = None) -> int:
    """``appliance chaos``: see the module docstring. Exit 0 when nothing was lost and nothing unexpected."""
    ap = argparse.ArgumentParser(prog="appliance chaos", description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fault-rate", type=float, default=0.05, help="share of requests that are worker faults")
    ap.add_argument("--json", type=Path, help="write the report here too")
    ap.add_argument("--port", type=int, default=0, help="daemon port (default: a free one)")
    args = ap.parse_args(argv)
    from appliance.tools.procs import free_port, stop_process, wait_serving

    port = args.port or free_port()
    home = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        pipes = Path(tmp) / "pipelines"
        pipes.mkdir()
        for p in (home / "pipelines").glob("*.toml"):
            (pipes / p.name).write_text(p.read_text())
        (pipes / "any.toml").write_text(ANY_PIPELINE)
        cfg = Path(tmp) / "chaos.toml"
        cfg.write_text(f'[server]\nlisten = ["127.0.0.1:{port}"]\n[model]\npipelines_dir = "{pipes}"\n'
                       '[workers]\nstep_timeout_s = 3.0\nmemory_bytes = 1073741824\n'
                       '[metrics]\nlisten = "127.0.0.1:0"\n')  # not 9400: a serving daemon may hold it
        env = {**os.environ, "APPLIANCE_TEST_DECODER_FAULTS": "1"}
        log_path = Path(tmp) / "daemon.log"  # a file, not a pipe: an unread pipe would block the daemon's logging
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen([sys.executable, "-m", "appliance.cli", "serve", "--config", str(cfg)],
                                    env=env, stdout=subprocess.DEVNULL, stderr=log_file)
        try:
            wait_serving(f"127.0.0.1:{port}", proc=proc, log=str(log_path))
            cases = bad_cases(args.seed)
            faults = [fault_case(k) for k in FAULTS.values()]
            valid = list(valid_files(512, seed=args.seed + 1).values())
            report = asyncio.run(_drive(f"127.0.0.1:{port}", cases, valid, args.duration, args.clients, proc.pid,
                                        args.fault_rate, faults, args.seed))
        finally:
            stop_process(proc)
            lines = log_path.read_text(errors="replace").splitlines()
    report["daemon_exit_code"] = proc.returncode
    report["daemon_log_lines"] = len(lines)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    ok = report["accepted_requests_lost"] == 0 and report["unexpected_count"] == 0 and proc.returncode == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

