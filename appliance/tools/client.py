"""The client commands, ``appliance health`` and ``appliance analyze``: a channel to a running daemon.

``health`` is a Nagios-style check: exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (a wrong check: bad arguments, a
client the daemon refuses, an unexpected answer). Its ``--json`` output is a stable interface (docs/operations.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

__all__ = ["CRITICAL", "DEFAULT_TARGET", "OK", "UNKNOWN", "WARNING", "add_tls_arguments", "cmd_analyze", "cmd_health",
           "positive_seconds"]

DEFAULT_TARGET = "127.0.0.1:50051"
OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0 (``--timeout``)."""
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


def add_tls_arguments(p: argparse.ArgumentParser) -> None:
    """The TLS options of a client command (``--tls-ca``, ``--tls-cert``, ``--tls-key``, ``--tls-server-name``)."""
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


def cmd_health(args: argparse.Namespace) -> int:
    """``appliance health``: one line (or ``--json``) and the Nagios exit code; anything unexpected is UNKNOWN."""
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


def cmd_analyze(args: argparse.Namespace) -> int:
    """``appliance analyze``: send each file, print its findings and timings (``--json``: one reply per line)."""
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
