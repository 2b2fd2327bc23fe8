"""Who may call what: a grpc.aio server interceptor that checks each call's peer before the handler runs.

Two roles: **status** (GetStatus, health, reflection, and the OIP calls that only describe the server and its
models) and **analyze** (everything else: Analyze, AnalyzeStream, OIP ModelInfer, and any method added later;
status is an allow-list so a new inference path cannot be left open to monitors). A caller gets a role from how
it connected (docs/security.md):

- over the **unix socket**: analyze. The socket's mode (0660, group ``server.socket_group``) is the control.
- over **plaintext loopback TCP**: ``access.loopback`` ("analyze" by default, "status" or "none").
- over **TLS**: with no allow-list, analyze (with mTLS that means "holds a certificate our CA signed"). With
  ``access.analyze_subjects`` / ``access.status_subjects`` set, the client certificate's common name or full
  subject (``CN=pacs-1,O=Hospital``, attributes in any order) must be in one of them; anyone else: none.

A call above its role is answered PERMISSION_DENIED before the handler runs. grpc.aio interceptors see only the
method name and metadata, not the peer, so :class:`AccessInterceptor` wraps the handler it is given and makes the
check on the call's own context, the one place the TLS auth context is available.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

if TYPE_CHECKING:
    from appliance.config import AccessConfig, Config

__all__ = [
    "ANALYZE",
    "NONE",
    "STATUS",
    "STATUS_METHODS",
    "AccessInterceptor",
    "AccessPolicy",
    "interceptors",
    "subject_key",
]

log = logging.getLogger(__name__)

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")
#: The check a wrapped handler awaits first: ``check(method, context)``; it aborts the call if not allowed.
_Check = Callable[[str, "grpc.aio.ServicerContext[Any, Any]"], Awaitable[Callable[[], None] | None]]

ANALYZE, STATUS, NONE = "analyze", "status", "none"
_RANK = {NONE: 0, STATUS: 1, ANALYZE: 2}

#: Methods the status role may call; every other method needs analyze. Held-out review, session 14: the list was
#: the other way round (analyze methods named, the rest status), and OIP ModelInfer answered a monitoring
#: certificate and a status-only loopback with findings.
STATUS_METHODS = frozenset({
    "/appliance.v1.Inference/GetStatus",
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.health.v1.Health/List",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    *(f"/inference.GRPCInferenceService/{m}" for m in (
        "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelConfig",
        "ModelStatistics")),
})


def subject_key(subject: str) -> tuple[str, ...]:
    """A subject's attributes in a fixed order, so ``O=H,CN=x`` and ``CN=x,O=H`` compare equal."""
    return tuple(sorted(part.strip() for part in re.split(r"(?<!\\),", subject) if part.strip()))


def _entries(entries: Iterable[str]) -> frozenset[str | tuple[str, ...]]:
    """An allow-list: a bare name (no ``=``) matches a certificate's CN, a subject (``CN=x,O=H``) its full subject."""
    return frozenset(e.strip() if "=" not in e else subject_key(e) for e in entries)


def _first(auth: Mapping[str, Iterable[bytes]], key: str) -> str:
    first = next(iter(auth.get(key) or ()), None)
    return first.decode("utf-8", "replace") if first is not None else ""


class AccessPolicy:
    """Maps a call's peer and auth context to a role, and a method to the role it needs."""

    def __init__(self, access: AccessConfig) -> None:
        self.access = access
        self.analyze = _entries(access.analyze_subjects)
        self.status = _entries(access.status_subjects)

    def role(self, peer: str, auth: Mapping[str, Iterable[bytes]]) -> tuple[str, str]:
        """Return ``(role, who)`` for a caller; ``who`` names it for log lines and errors (never patient data)."""
        if peer.startswith("unix:"):
            return ANALYZE, "unix socket"
        if _first(auth, "transport_security_type") != "ssl":
            return self.access.loopback, f"plaintext {peer}"
        cn, subject = _first(auth, "x509_common_name"), _first(auth, "x509_subject")
        who = subject or "TLS client without certificate"
        if not (self.analyze or self.status):
            return ANALYZE, who
        # the bare common name is compared only with bare-name entries: a CN of "O=Test Hospital,CN=monitor" in
        # another organisation's certificate matched that full-subject entry (held-out review, session 14)
        names: set[str | tuple[str, ...]] = {cn} if cn else set()
        if subject:
            names.add(subject_key(subject))
        if names & self.analyze:
            return ANALYZE, who
        if names & self.status:
            return STATUS, who
        return NONE, who

    @staticmethod
    def needed(method: str) -> str:
        """The role ``method`` (``/package.Service/Method``) needs."""
        return STATUS if method in STATUS_METHODS else ANALYZE

    def allows(self, method: str, peer: str, auth: Mapping[str, Iterable[bytes]]) -> tuple[bool, str]:
        """``(allowed, who)`` for one call."""
        role, who = self.role(peer, auth)
        return _RANK[role] >= _RANK[self.needed(method)], who


#: Status streams that stay open as long as the client likes; they get a budget of their own.
LONG_LIVED = frozenset({
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
})


class AccessInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every handler so that the call is checked against :class:`AccessPolicy` first.

    Open health-watch and reflection streams are also capped, ``stream_budget`` in all and an eighth of that
    (at least 4) per caller: grpc's ``server.max_concurrent_rpcs`` counts every call, and a status-only client
    holding 1,050 Watch streams made every Analyze RESOURCE_EXHAUSTED (held-out review, session 14).
    """

    def __init__(self, policy: AccessPolicy, stream_budget: int = 256) -> None:
        self.policy = policy
        self.denied = 0  # calls refused (read by tests and status)
        self.stream_budget = max(stream_budget, 8)
        self.per_caller = max(4, self.stream_budget // 8)
        self._open: dict[str, int] = {}  # caller -> open long-lived streams

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Request, _Response] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Request, _Response] | None:
        """Return the handler wrapped with the access check (unknown methods pass through unchanged)."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return _wrap(handler, handler_call_details.method, self._check)

    async def _check(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> Callable[[], None] | None:
        """Abort the call unless its caller may make it; for a long-lived stream, return what ends its count."""
        allowed, who = self.policy.allows(method, context.peer(), context.auth_context())
        if not allowed:
            self.denied += 1
            log.warning("access denied: %s may not call %s", who, method)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{who} may not call {method} (config [access])")
        if method not in LONG_LIVED:
            return None
        caller = "plaintext" if who.startswith("plaintext") else who  # every plaintext loopback user is one caller
        if sum(self._open.values()) >= self.stream_budget or self._open.get(caller, 0) >= self.per_caller:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"too many open health-watch and reflection streams ({self.per_caller} per caller, "
                                f"{self.stream_budget} in all: a quarter of server.max_concurrent_rpcs)")
        self._open[caller] = self._open.get(caller, 0) + 1

        def release() -> None:
            self._open[caller] -= 1

        return release


class _Undecodable:
    """Stands in for a request message that did not parse, so the call can be refused INVALID_ARGUMENT.

    grpc answers a deserializer's exception with UNKNOWN "Unexpected DecodeError" and an ERROR log line, which any
    client could fill the journal with (held-out review, session 14).
    """

    def __init__(self, error: BaseException) -> None:
        self.error = type(error).__name__


def _lenient(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def deserialize(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as e:  # noqa: BLE001 - any parse failure is the client's malformed message
            return _Undecodable(e)

    return deserialize


async def _decoded(request: Any, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    """``request`` itself, or a stream of them that refuses the call at the first one that did not parse."""
    if isinstance(request, _Undecodable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"the request is not a valid message for {method} ({request.error})")
    if not hasattr(request, "__aiter__"):
        return request

    async def stream() -> Any:
        async for item in request:
            if isinstance(item, _Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"a request on the stream is not a valid message for {method} ({item.error})")
            yield item

    return stream()


def _wrap(
    handler: grpc.RpcMethodHandler[_Request, _Response], method: str, check: _Check
) -> grpc.RpcMethodHandler[_Request, _Response]:
    # Under grpc.aio the behaviours are coroutine functions or async generators; the stubs type grpc's sync API
    # (plain callables and iterators), so the behaviours are handled as Any here.
    deserializer: Any = _lenient(handler.request_deserializer)
    serializer = handler.response_serializer
    if handler.unary_unary:
        inner: Any = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await check(method, context)
            return await inner(await _decoded(request, method, context), context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, deserializer, serializer)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(
            _streaming(handler.unary_stream, method, check), deserializer, serializer
        )
    if handler.stream_unary:
        inner_su: Any = handler.stream_unary

        async def stream_unary(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await check(method, context)
            return await inner_su(await _decoded(requests, method, context), context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, deserializer, serializer)
    return grpc.stream_stream_rpc_method_handler(
        _streaming(handler.stream_stream, method, check), deserializer, serializer
    )


def _streaming(inner: Any, method: str, check: _Check) -> Any:
    """Wrap a streaming behaviour keeping its style: an async generator, or a coroutine using context.write."""
    if inspect.isasyncgenfunction(inner):

        async def generator(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            release = await check(method, context)
            try:
                async for response in inner(await _decoded(request, method, context), context):
                    yield response
            finally:
                if release is not None:
                    release()

        return generator

    async def coroutine(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        release = await check(method, context)
        try:
            return await inner(await _decoded(request, method, context), context)
        finally:
            if release is not None:
                release()

    return coroutine


def interceptors(cfg: Config) -> list[grpc.aio.ServerInterceptor]:
    """The interceptors to pass to ``grpc.aio.server(interceptors=...)`` for this configuration."""
    return [AccessInterceptor(AccessPolicy(cfg.access), stream_budget=cfg.server.max_concurrent_rpcs // 4)]
