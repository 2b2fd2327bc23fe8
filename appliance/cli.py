"""The ``appliance`` command: serve · health · analyze · bench · backends · doctor · models · thermal-sim.

Exit codes: 0 success; 1 failure (``health``: WARNING); 2 ``health``: CRITICAL; 3 ``health``: UNKNOWN (bad
arguments or an unexpected answer). ``--json`` outputs are stable interfaces.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]

log = logging.getLogger("appliance")

DEFAULT_TARGET = "127.0.0.1:50051"


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors exit with a chosen code (3 = UNKNOWN for `health`)."""

    error_code = 2

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(self.error_code, f"{self.prog}: error: {message}\n")


# ---- serve ------------------------------------------------------------------------------------------------


EX_CONFIG = 78  # sysexits.h: configuration error; the unit's RestartPreventExitStatus=78 stops restart loops


def _cmd_serve(args: argparse.Namespace) -> int:
    from appliance.logs import configure_logging

    level = "debug" if args.verbose else "info"
    configure_logging(level)  # before grpc is imported (GRPC_VERBOSITY) and before the config is read
    from appliance.config import load_config
    from appliance.errors import ApplianceError, ConfigError, ManifestError
    from appliance.serving.preflight import preflight

    overrides: dict[str, dict[str, Any]] = {}
    if args.listen:
        overrides.setdefault("server", {})["listen"] = args.listen
    if args.metrics_listen is not None:
        overrides.setdefault("metrics", {})["listen"] = args.metrics_listen
    if args.backend:
        overrides.setdefault("engine", {})["backend"] = args.backend
    if args.thermal:
        overrides.setdefault("thermal", {})["sensor"] = args.thermal
    if args.no_overlap:
        overrides.setdefault("batcher", {})["overlap"] = False
    if args.precision:
        overrides.setdefault("model", {})["precision"] = args.precision
    try:
        config = load_config(args.config, overrides)
        configure_logging("debug" if args.verbose else config.logging.level, config.logging.journald)
        log.debug("configuration loaded from %s", args.config or "built-in defaults")
        preflight(config)
        from appliance.serving.daemon import serve

        return asyncio.run(serve(config))
    except (ConfigError, ManifestError) as e:  # start-up checks and the model's files: one line, before READY=1
        log.critical("cannot start: %s", e)
        return EX_CONFIG  # a restart cannot fix these; BackendUnavailable (a driver not up yet) stays 1
    except ApplianceError as e:
        log.critical("cannot start: %s", e)
        return 1


# ---- health -----------------------------------------------------------------------------------------------

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def _channel(args: argparse.Namespace, options: list[tuple[str, Any]] | None = None) -> Any:
    """A channel to ``--target``: TLS when ``--tls-ca`` is given (plus a client certificate for mTLS)."""
    import grpc

    if not args.tls_ca:
        return grpc.insecure_channel(args.target, options=options)
    key = Path(args.tls_key).read_bytes() if args.tls_key else None
    cert = Path(args.tls_cert).read_bytes() if args.tls_cert else None
    creds = grpc.ssl_channel_credentials(Path(args.tls_ca).read_bytes(), key, cert)
    if args.tls_server_name:
        options = [*(options or []), ("grpc.ssl_target_name_override", args.tls_server_name)]
    return grpc.secure_channel(args.target, creds, options=options)


def _add_tls_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-ca", help="CA bundle (PEM) that signed the daemon's certificate: connect with TLS")
    p.add_argument("--tls-cert", help="client certificate (PEM) for mutual TLS")
    p.add_argument("--tls-key", help="client key (PEM) for mutual TLS")
    p.add_argument("--tls-server-name", help="expected server name, if not the target's host")


def _target_problem(target: str) -> str | None:
    """What is wrong with a ``--target`` gRPC cannot mean (None: it looks like an address).

    gRPC takes any string and just never connects, so ``--target 'nonsense::::'`` read as an unreachable daemon
    (CRITICAL, a page) instead of a wrong check (ops review, session 18).
    """
    if target.startswith(("unix:", "unix-abstract:")):
        return None if target.partition(":")[2] else "a unix target needs a path (unix:/run/edge-appliance/grpc.sock)"
    if target.startswith(("dns:", "ipv4:", "ipv6:")):
        return None  # gRPC's own URI schemes: passed on as they are
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        return "expected HOST:PORT with a port in 1..65535, or unix:PATH"
    if host.startswith("["):
        return None if host.endswith("]") and ":" in host else "a bracketed IPv6 host must end with ]"
    if ":" in host:
        return "an IPv6 host must be bracketed: [::1]:50051"
    return None


def _cmd_health(args: argparse.Namespace) -> int:
    problem = _target_problem(args.target)
    if problem is not None:  # a wrong check, not a down daemon
        print(f"EDGE-APPLIANCE UNKNOWN: --target {args.target!r}: {problem}")
        return UNKNOWN
    try:
        return _health(args)
    except Exception as e:  # noqa: BLE001 - Nagios contract: anything unexpected is UNKNOWN, never WARNING
        print(f"EDGE-APPLIANCE UNKNOWN: {type(e).__name__}: {e}")
        return UNKNOWN


def _rpc_details(error: Exception) -> str:
    """A gRPC error's details ("" when it has none: a channel-level error may not carry them)."""
    details = getattr(error, "details", None)
    return (details() if callable(details) else "") or ""


def _why_unreachable(channel: Any, args: argparse.Namespace) -> str:
    """The reason gRPC gives for a channel that never became ready (a refused connection, a failed handshake)."""
    import grpc

    from appliance.proto.v1 import inference_pb2 as pb
    from appliance.proto.v1 import inference_pb2_grpc as pb_grpc

    try:
        pb_grpc.InferenceStub(channel).GetStatus(pb.GetStatusRequest(), timeout=min(args.timeout, 2.0))
    except grpc.RpcError as e:
        details = _rpc_details(e)
        if args.tls_ca:  # a refused client certificate reads "Socket closed", a wrong CA "Ssl handshake failed"
            return (f": {details or 'no answer'} (over TLS this is most often the handshake: check --tls-ca, "
                    "--tls-cert, --tls-key and their validity dates)")
        return f": {details}" if details else ""
    return ""


def _health(args: argparse.Namespace) -> int:
    import grpc
    from google.protobuf.json_format import MessageToDict
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from appliance.proto.v1 import inference_pb2 as pb
    from appliance.proto.v1 import inference_pb2_grpc as pb_grpc

    try:
        with _channel(args) as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=args.timeout)
            except grpc.FutureTimeoutError:
                why = _why_unreachable(channel, args)
                if "permission denied" in why.lower():  # this client may not open the socket: the check is wrong
                    print(f"EDGE-APPLIANCE UNKNOWN: {args.target} refused this client{why} (the unix socket is "
                          "0660: run the check as a member of its group, systemd/README.md)")
                    return UNKNOWN
                print(f"EDGE-APPLIANCE CRITICAL: {args.target} unreachable within {args.timeout:g} s{why}")
                return CRITICAL
            # types-grpcio-health-checking declares HealthStub without its methods (Check, Watch)
            health: Any = health_pb2_grpc.HealthStub(channel)
            check = health.Check(health_pb2.HealthCheckRequest(service="appliance.v1.Inference"), timeout=args.timeout)
            status = pb_grpc.InferenceStub(channel).GetStatus(pb.GetStatusRequest(), timeout=args.timeout)
    except grpc.RpcError as e:
        code = e.code() if hasattr(e, "code") else None
        details = _rpc_details(e)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED):
            print(f"EDGE-APPLIANCE CRITICAL: {args.target}: {code.name}: {details}")
            return CRITICAL
        if code is grpc.StatusCode.PERMISSION_DENIED:  # the monitor's own credentials: it cannot tell, so UNKNOWN
            print(f"EDGE-APPLIANCE UNKNOWN: {args.target} refused this client: PERMISSION_DENIED: {details} "
                  "(check --tls-cert against [access] status_subjects)")
            return UNKNOWN
        print(f"EDGE-APPLIANCE UNKNOWN: unexpected answer from {args.target}: "
              f"{code.name if code is not None else type(e).__name__}: {details}")
        return UNKNOWN
    serving = check.status == health_pb2.HealthCheckResponse.SERVING
    if not serving and status.state == "DRAINING":  # a planned stop or restart (docs/operations.md): no page
        rc, word = WARNING, "WARNING"
    elif not serving:
        rc, word = CRITICAL, "CRITICAL"
    elif status.state == "DEGRADED" or status.degraded_reasons:
        rc, word = WARNING, "WARNING"
    elif status.state == "SERVING":
        rc, word = OK, "OK"
    else:
        rc, word = UNKNOWN, "UNKNOWN"
    if args.json:
        doc = MessageToDict(status, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
        doc = {"schema_version": 1, "exit_code": rc, "health": "SERVING" if serving else "NOT_SERVING", **doc}
        print(json.dumps(doc, indent=2, sort_keys=True))
        return rc
    total = status.latency_ms.get("total")
    perf = (
        f"'queue'={status.queue_depth};{int(0.8 * status.queue_capacity)};{status.queue_capacity};0;"
        f"{status.queue_capacity} 'batch_fill'={status.batch_fill:.3f};;;0;1"
    )
    if total is not None and total.count:
        perf += f" 'total_p50'={total.p50:.1f}ms 'total_p99'={total.p99:.1f}ms"
    if status.thermal.enabled:
        perf += f" 'gpu_temp'={status.thermal.temperature_c:.0f};;75 'duty'={status.thermal.duty:.2f};;;0;1"
    detail = ", ".join(status.degraded_reasons) or status.state.lower()
    model = status.model
    print(f"EDGE-APPLIANCE {word}: {detail}; {model.name} {model.precision} on {model.backend} | {perf}")
    return rc


# ---- analyze ----------------------------------------------------------------------------------------------


def _cmd_analyze(args: argparse.Namespace) -> int:
    import grpc
    from google.protobuf.json_format import MessageToDict

    from appliance.proto.v1 import inference_pb2 as pb
    from appliance.proto.v1 import inference_pb2_grpc as pb_grpc

    rc = 0
    options = [("grpc.max_send_message_length", 128 << 20), ("grpc.max_receive_message_length", 128 << 20)]
    with _channel(args, options) as channel:
        stub = pb_grpc.InferenceStub(channel)
        for path in args.files:
            request = pb.AnalyzeRequest(
                dicom=Path(path).read_bytes(),
                pipeline=args.pipeline,
                priority=pb.BATCH if args.batch else pb.INTERACTIVE,
            )
            try:
                reply = stub.Analyze(request, timeout=args.timeout)
            except grpc.RpcError as e:
                print(f"{path}: {e.code().name}: {e.details()}", file=sys.stderr)
                rc = 1
                continue
            if args.json:
                print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True)))
                continue
            t = reply.timings
            print(
                f"{path}: sop={reply.sop_instance_uid} model={reply.model.name}:{reply.model.version} "
                f"{reply.model.precision} on {reply.model.backend}"
            )
            for frame in reply.frames:
                top = frame.findings[0]
                loc = ""
                if frame.HasField("location"):
                    loc = f" peak at (row {frame.location.row:.0f}, col {frame.location.column:.0f})"
                print(f"  frame {frame.frame_index}: {top.label} score={top.score:.3f}{loc}")
            print(
                f"  timings ms: queue={t.queue_ms:.1f} preprocess={t.preprocess_ms:.1f} "
                f"engine={t.engine_ms:.1f} total={t.total_ms:.1f}"
            )
    return rc


# ---- backends / doctor ------------------------------------------------------------------------------------


def _cmd_backends(args: argparse.Namespace) -> int:
    from appliance.dicom import decoder_report
    from appliance.engines import _load_class, backend_report

    engines: dict[str, dict[str, Any]] = {}
    for name, why in backend_report().items():
        if name == "fake":
            continue
        try:
            needs = dict(_load_class(name).DEPENDENCIES)
        except ImportError:
            needs = {}
        engines[name] = {"available": why is None, "reason": why, "needs": needs}
    report = {"engines": engines, "decoders": decoder_report()}
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    for name, entry in engines.items():
        print(f"engine  {name:20s} {'available' if entry['available'] else 'unavailable - ' + entry['reason']}")
    for uid, info in report["decoders"].items():
        print(f"decoder {uid:24s} {info}")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from appliance.tools.doctor import run_doctor

    return run_doctor(args)


def _cmd_synth(args: argparse.Namespace) -> int:
    import pydicom.uid

    from appliance.tools import synthetic

    syntaxes = {
        "explicit": pydicom.uid.ExplicitVRLittleEndian,
        "implicit": pydicom.uid.ImplicitVRLittleEndian,
        "rle": pydicom.uid.RLELossless,
        "jpegls": pydicom.uid.JPEGLSLossless,
        "j2k": pydicom.uid.JPEG2000Lossless,
        "deflated": pydicom.uid.DeflatedExplicitVRLittleEndian,
    }
    out = Path(args.out)
    if args.count > 1 or args.workload:
        out.mkdir(parents=True, exist_ok=True)
    if args.workload:  # the bench's named mix, byte for byte (same seed, same files)
        for i, data in enumerate(synthetic.workload(args.workload, args.count, args.seed)):
            (out / f"{args.workload}-{i:04d}.dcm").write_bytes(data)
        print(f"{out}: {args.count} files of workload {args.workload!r} (seed {args.seed})")
        return 0
    for i in range(args.count):
        nodule = {"yes": True, "no": False, "random": None}[args.nodule]
        truth = synthetic.generate_slice(args.seed + i, nodule=nodule)
        data = synthetic.to_dicom(truth, transfer_syntax=syntaxes[args.syntax], instance_number=i + 1)
        path = out / f"slice-{args.seed + i:05d}.dcm" if args.count > 1 else out
        path.write_bytes(data)
        sizes = [f"{n[2]:.1f} mm" for n in truth.nodules]
        print(f"{path}: nodule={'yes' if truth.has_nodule else 'no'} {' '.join(sizes)}")
    return 0


# ---- delegated subcommands --------------------------------------------------------------------------------


def _cmd_bench(argv: list[str]) -> int:
    from appliance.tools.bench import main as bench_main

    return bench_main(argv)


def _cmd_thermal_sim(argv: list[str]) -> int:
    from appliance.thermal.simcli import main as sim_main

    return sim_main(argv)


def _cmd_chaos(argv: list[str]) -> int:
    from appliance.tools.chaos import main as chaos_main

    return chaos_main(argv)


def _cmd_models(argv: list[str]) -> int:
    from appliance.modelbuild import cli as models_cli

    commands = dict(models_cli.COMMANDS)
    if argv and argv[0] == "build-engine":  # TensorRT plan for this GPU (appliance.engines.trt_build)
        from appliance.engines.trt_build import build_engine_main

        return build_engine_main(argv[1:])
    if not argv or argv[0] not in commands:
        print("usage: appliance models {build,eval,derive,lowpass,build-engine} NAME [options]", file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])


DELEGATED = {"bench": _cmd_bench, "thermal-sim": _cmd_thermal_sim, "models": _cmd_models, "chaos": _cmd_chaos}


def _parser() -> _Parser:
    parser = _Parser(prog="appliance", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("serve", help="run the gRPC daemon")
    p.add_argument("--config", type=Path, help="TOML config (default: built-in defaults)")
    p.add_argument("--listen", action="append", help="address to bind (repeatable), e.g. 127.0.0.1:50051, unix:/path")
    p.add_argument("--metrics-listen", help='Prometheus /metrics address (default 127.0.0.1:9400; "" = off)')
    p.add_argument("--backend", help="engine backend: auto, tensorrt, onnxruntime-tensorrt, onnxruntime-cuda, "
                   "onnxruntime-cpu, fake, triton")
    p.add_argument("--precision", help="model artifact precision (default: the manifest's)")
    p.add_argument("--thermal", choices=["auto", "nvml", "none", "sim"], help="thermal sensor")
    p.add_argument("--no-overlap", action="store_true", help="preprocess on the engine thread (sequential)")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("health", help="Nagios-style health check (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN)")
    p.error_code = UNKNOWN
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"daemon address (default {DEFAULT_TARGET})")
    p.add_argument("--json", action="store_true", help="print the full status as JSON")
    p.add_argument("--timeout", type=_positive_seconds, default=2.0, help="seconds per call")
    _add_tls_arguments(p)
    p.set_defaults(func=_cmd_health)

    p = sub.add_parser("analyze", help="send DICOM files to a running daemon and print findings and timings")
    p.add_argument("files", nargs="+", help="DICOM Part-10 files")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--pipeline", default="", help="pipeline name (default: the daemon's default)")
    p.add_argument("--batch", action="store_true", help="BATCH priority (default INTERACTIVE)")
    p.add_argument("--json", action="store_true", help="one JSON reply per line")
    p.add_argument("--timeout", type=float, default=30.0)
    _add_tls_arguments(p)
    p.set_defaults(func=_cmd_analyze)

    p = sub.add_parser("synth", help="write synthetic CT slices as DICOM (phantom data, no patient data)")
    p.add_argument("--out", default="slice.dcm", help="file (or directory with --count > 1)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--nodule", choices=["yes", "no", "random"], default="yes")
    p.add_argument("--syntax", choices=["explicit", "implicit", "rle", "jpegls", "j2k", "deflated"], default="explicit")
    p.add_argument("--workload", help="write COUNT files of a named bench workload (e.g. quarters) into --out")
    p.set_defaults(func=_cmd_synth)

    p = sub.add_parser("backends", help="which engines and DICOM decoders are usable here, and why not")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_backends)

    p = sub.add_parser("doctor", help="self-test: dependencies, model integrity, engine; --gpu, --thermal")
    p.add_argument("--gpu", action="store_true",
                   help="RTX self-test: TensorRT plan, GPU vs CPU, W4A16 vs FP16, end-to-end (exit 3: no GPU)")
    p.add_argument("--no-e2e", action="store_true", help="with --gpu: skip the end-to-end daemon run")
    p.add_argument("--thermal", action="store_true", help="commissioning: measure the thermal plant (GPU)")
    p.add_argument("--sim", action="store_true", help="with --thermal: commission the simulated plant (demo)")
    p.add_argument("--quick", action="store_true", help="with --thermal: short smoke run, not a commissioning")
    p.add_argument("--json", action="store_true")
    p.add_argument("--config", type=Path)
    p.set_defaults(func=_cmd_doctor)

    for name, help_text in (
        ("bench", "load test: throughput, latency, overlap vs sequential (JSON report)"),
        ("thermal-sim", "run the thermal governor against the simulated GPU plant"),
        ("chaos", "hostile inputs and crashing decoders against a real daemon; reports lost requests, restarts"),
        ("models", "build or evaluate a model: models build NAME | models eval NAME --seed S --n N --json"),
    ):
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``appliance`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in argv[:1] or "--verbose" in argv[:1]
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from appliance.logs import quiet_third_party

    quiet_third_party(logging.DEBUG if verbose else logging.INFO)
    rest = argv[1:] if verbose else argv
    if rest and rest[0] in DELEGATED:
        return DELEGATED[rest[0]](rest[1:])
    parser = _parser()
    if rest and rest[0] == "health":
        parser.error_code = UNKNOWN  # Nagios: bad arguments are UNKNOWN, also for unknown options
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
