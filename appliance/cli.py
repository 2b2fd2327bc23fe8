"""The ``appliance`` command: serve · health · analyze · bench · backends · doctor · models · thermal-sim.

Exit codes: 0 success; 1 failure (``health``: WARNING); 2 ``health``: CRITICAL; 3 ``health``: UNKNOWN (bad
arguments or an unexpected answer). ``--json`` outputs are stable interfaces.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from appliance.tools.client import (
    DEFAULT_TARGET,
    UNKNOWN,
    add_tls_arguments,
    cmd_analyze,
    cmd_health,
    positive_seconds,
)

__all__ = ["main"]

log = logging.getLogger("appliance")

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
    p.add_argument("--timeout", type=positive_seconds, default=2.0, help="seconds per call")
    add_tls_arguments(p)
    p.set_defaults(func=cmd_health)

    p = sub.add_parser("analyze", help="send DICOM files to a running daemon and print findings and timings")
    p.add_argument("files", nargs="+", help="DICOM Part-10 files")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--pipeline", default="", help="pipeline name (default: the daemon's default)")
    p.add_argument("--batch", action="store_true", help="BATCH priority (default INTERACTIVE)")
    p.add_argument("--json", action="store_true", help="one JSON reply per line")
    p.add_argument("--timeout", type=float, default=30.0)
    add_tls_arguments(p)
    p.set_defaults(func=cmd_analyze)

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
