"""Command line for the model build: ``build`` and ``eval``.

``python -m appliance.modelbuild.cli build ct-nodule [--check] [--models-dir DIR] [--quick]``
``python -m appliance.modelbuild.cli eval ct-nodule --seed S --n N [--json] [--precision P ...]``
``python -m appliance.modelbuild.cli derive ct-nodule [--check]`` (FP16 and W4A16 from FP32, see derive.py)
``python -m appliance.modelbuild.cli lowpass ct-nodule`` (half-resolution JPEG 2000 input, see lowpass.py)

The main ``appliance`` CLI wires :func:`build_main`, :func:`eval_main`, :func:`derive_main` and
:func:`lowpass_main` as ``appliance models build|eval|derive|lowpass``.
``eval`` needs only onnxruntime and numpy; ``build`` needs the ``build`` extra (torch, onnx, onnxscript, tqdm).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from appliance.errors import ApplianceError
from appliance.manifest import load_manifest

__all__ = ["build_main", "derive_main", "eval_main", "main"]

log = logging.getLogger(__name__)

DEFAULT_MODELS_DIR = Path(__file__).resolve().parents[2] / "models"


def _json_default(o: object) -> object:
    if hasattr(o, "item"):
        return o.item()  # numpy scalars
    if isinstance(o, Path):
        return str(o)
    raise TypeError(type(o).__name__)


def eval_main(argv: Sequence[str] | None = None) -> int:
    """Evaluate a model's artifacts on freshly generated slices of any seed; return the exit status.

    Args:
        argv: ``name [--seed S] [--n N] [--json] [--precision P ...] [--models-dir DIR] [--workers W]
            [--no-timing]``.
    """
    ap = argparse.ArgumentParser(prog="appliance models eval", description=eval_main.__doc__)
    ap.add_argument("name", help="model name, e.g. ct-nodule")
    ap.add_argument("--seed", type=int, default=None,
                    help="data seed (default: the held-out seed the manifest's metrics were measured on; "
                         "the training seed is in model.toml)")
    ap.add_argument("--n", type=int, default=2000, help="number of slices (default 2000)")
    ap.add_argument("--json", action="store_true", help="print the metrics as JSON")
    ap.add_argument("--precision", action="append", help="precision(s) to evaluate (default: all)")
    ap.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR)
    ap.add_argument("--workers", type=int, default=1, help="data generation processes")
    ap.add_argument("--no-timing", action="store_true", help="skip the ms-per-batch measurement")
    args = ap.parse_args(argv)

    from appliance.modelbuild.data import InputParams, generate_pool
    from appliance.modelbuild.evaluate import evaluate_artifact

    try:
        manifest = load_manifest(args.models_dir / args.name / "model.toml")
        precisions = args.precision or sorted(manifest.artifacts)
        arts = [manifest.artifact(p) for p in precisions]
        for art in arts:
            art.verify()
    except ApplianceError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    if args.seed is None:
        args.seed = int(manifest.artifact().build.get("eval_seed", 2))
    pre = manifest.input.preprocess
    params = InputParams(
        size=manifest.input.shape[2],
        window_center=float(pre["window_center"]),
        window_width=float(pre["window_width"]),
        stride=int(manifest.postprocess.get("heatmap_stride_px", 16)),
    )
    pool = generate_pool(args.seed, args.n, params, workers=args.workers)
    threshold = float(manifest.postprocess.get("threshold", 0.5))
    result = {"model": manifest.name, "version": manifest.version, "seed": args.seed, "n": args.n,
              "metrics": {}}
    for p, art in zip(precisions, arts, strict=True):
        result["metrics"][p] = evaluate_artifact(art.path, pool, session_config=art.session_config,
                                                 threshold=threshold, timing_runs=0 if args.no_timing else 10)
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2, sort_keys=True, default=_json_default) + "\n")
    else:
        for p, m in result["metrics"].items():
            sys.stdout.write(
                f"{manifest.name} {p}: AUC {m['auc']:.4f} (<8 mm {m['auc_lt8mm']:.4f}), "
                f"sens@spec0.9 {m['sens_at_spec90']:.3f}, hit rate {m['hit_rate']:.3f}, "
                f"{m.get('ms_per_batch', float('nan')):.1f} ms/batch\n")
    return 0


def build_main(argv: Sequence[str] | None = None) -> int:
    """Build a model reproducibly from its seeds; return the exit status (1: reproduction out of tolerance).

    Args:
        argv: ``name [--check] [--models-dir DIR] [--quick] [--steps N] [--workers W] [--threads T]``.
    """
    ap = argparse.ArgumentParser(prog="appliance models build", description=build_main.__doc__)
    ap.add_argument("name", help="model name (only ct-nodule is defined)")
    ap.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR)
    ap.add_argument("--check", action="store_true", help="build in a scratch dir and only compare")
    ap.add_argument("--quick", action="store_true", help="tiny smoke build (not a reproduction)")
    ap.add_argument("--steps", type=int, help="override the training steps")
    ap.add_argument("--workers", type=int, help="data generation processes (default 2)")
    ap.add_argument("--threads", type=int, help="torch threads (default 2)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--state-file", type=Path,
                    help="save the trained weights here; if it exists, load them and skip training")
    args = ap.parse_args(argv)
    if args.name != "ct-nodule":
        sys.stderr.write(f"error: no build recipe for model {args.name!r} (have: ct-nodule)\n")
        return 2

    from appliance.modelbuild.build import BuildConfig, build, report_dict

    cfg = BuildConfig()
    if args.quick:
        cfg = replace(cfg, train_n=128, eval_n=64, blocks=(32,), train=replace(cfg.train, steps=4))
    if args.steps:
        cfg = replace(cfg, train=replace(cfg.train, steps=args.steps))
    if args.workers:
        cfg = replace(cfg, workers=args.workers)
    if args.threads:
        cfg = replace(cfg, train=replace(cfg.train, threads=args.threads))
    report = build(cfg, args.models_dir / args.name, check_only=args.check, progress=not args.no_progress,
                   state_file=args.state_file)
    sys.stdout.write(json.dumps(report_dict(report), indent=2, sort_keys=True, default=_json_default) + "\n")
    if report.comparison is not None and not report.comparison["ok"]:
        sys.stderr.write("error: the rebuild is outside the reproduction tolerance of the committed model\n")
        return 1
    return 0


def derive_main(argv: Sequence[str] | None = None) -> int:
    """Derive the FP16 and W4A16 artifacts from the FP32 file, evaluate them, record them in model.toml.

    Args:
        argv: ``name [--check] [--seed S] [--n N] [--models-dir DIR] [--workers W]``.
    """
    ap = argparse.ArgumentParser(prog="appliance models derive", description=derive_main.__doc__)
    ap.add_argument("name", help="model name, e.g. ct-nodule")
    ap.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR)
    ap.add_argument("--check", action="store_true", help="write nothing; fail if the committed files differ")
    ap.add_argument("--seed", type=int, default=None, help="evaluation seed (default: the manifest's eval seed)")
    ap.add_argument("--n", type=int, default=2000, help="evaluation slices (default 2000)")
    ap.add_argument("--workers", type=int, default=1, help="data generation processes")
    args = ap.parse_args(argv)

    from appliance.modelbuild.derive import derive

    try:
        report = derive(args.models_dir / args.name, seed=args.seed, n=args.n, check=args.check,
                        workers=args.workers)
    except ApplianceError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    sys.stdout.write(json.dumps(report, indent=2, sort_keys=True, default=_json_default) + "\n")
    return 0 if report["ok"] else 1


def lowpass_main(argv: Sequence[str] | None = None) -> int:
    """Measure the model on half-resolution JPEG 2000 input; record the AUCs and whether pipelines may use it.

    Args:
        argv: ``name [--seed S] [--n N] [--models-dir DIR] [--workers W]``.
    """
    ap = argparse.ArgumentParser(prog="appliance models lowpass", description=lowpass_main.__doc__)
    ap.add_argument("name", help="model name, e.g. ct-nodule")
    ap.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR)
    ap.add_argument("--seed", type=int, default=None, help="held-out seed (default: the manifest's eval seed)")
    ap.add_argument("--n", type=int, default=2000, help="slices (default 2000)")
    ap.add_argument("--workers", type=int, default=1, help="processes building the inputs")
    args = ap.parse_args(argv)

    from appliance.modelbuild.lowpass import record_lowpass

    try:
        report = record_lowpass(args.models_dir / args.name, seed=args.seed, n=args.n, workers=args.workers)
    except ApplianceError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    sys.stdout.write(json.dumps(report, indent=2, sort_keys=True, default=_json_default) + "\n")
    return 0


COMMANDS = {"build": build_main, "eval": eval_main, "derive": derive_main, "lowpass": lowpass_main}


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``build`` / ``eval`` / ``derive`` / ``lowpass``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        sys.stderr.write("usage: python -m appliance.modelbuild.cli {build,eval,derive,lowpass} NAME ...\n")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
