"""One service state that feeds gRPC health, sd_notify and GetStatus.

=============  ======  =========================  ====================  ===========================
state          ""      appliance.v1.Inference,    appliance.thermal     sd_notify
                       inference.GRPCInferenceService
=============  ======  =========================  ====================  ===========================
STARTING       NOT     NOT                        NOT                   STATUS=loading
SERVING        SERV    SERV                       SERV unless blind/..  READY=1, STATUS=serving
DEGRADED       SERV    SERV                       per governor          STATUS=degraded: ...
DRAINING       NOT     NOT                        NOT                   STOPPING=1
NOT_SERVING    NOT     NOT                        per governor          STATUS=not serving: ...
=============  ======  =========================  ====================  ===========================

DEGRADED (throttled, blind, queue over 80 %, overloaded) is visible in GetStatus and metrics only: soft throttling must
not flip gRPC health (docs/serving.md). A thermal hard stop (governor STOPPED/EMERGENCY) and a dead engine
are NOT_SERVING.
"""

from __future__ import annotations

import enum
import logging

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from appliance.serving.notify import Notifier
from appliance.thermal.control import HealthAction

__all__ = ["INFERENCE_SERVICE", "INFERENCE_SERVICES", "OIP_SERVICE", "THERMAL_SERVICE", "HealthState", "ServiceState"]

log = logging.getLogger(__name__)

INFERENCE_SERVICE = "appliance.v1.Inference"
OIP_SERVICE = "inference.GRPCInferenceService"  # the Open Inference Protocol: the same request path, the same state
INFERENCE_SERVICES = (INFERENCE_SERVICE, OIP_SERVICE)
THERMAL_SERVICE = "appliance.thermal"

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ServiceState(enum.Enum):
    """The daemon's state."""

    STARTING = "STARTING"
    SERVING = "SERVING"
    DRAINING = "DRAINING"
    NOT_SERVING = "NOT_SERVING"


class HealthState:
    """Owns the gRPC health servicer and the notifier; every state change goes through here."""

    def __init__(self, servicer: health_aio.HealthServicer, notifier: Notifier) -> None:
        self.servicer = servicer
        self.notifier = notifier
        self.state = ServiceState.STARTING
        self.reason = "loading"
        self._thermal_ok = True
        self._ready_sent = False

    async def init(self) -> None:
        """Set every name NOT_SERVING before the server starts (the reference servicer starts "" SERVING)."""
        for name in ("", *INFERENCE_SERVICES, THERMAL_SERVICE):
            await self.servicer.set(name, _NOT_SERVING)
        self.notifier.status("loading model")

    async def set_serving(self) -> None:
        """Warm-up done: SERVING, and READY=1 exactly once."""
        self.state, self.reason = ServiceState.SERVING, "serving"
        for name in ("", *INFERENCE_SERVICES):
            await self.servicer.set(name, _SERVING)
        await self.servicer.set(THERMAL_SERVICE, _SERVING if self._thermal_ok else _NOT_SERVING)
        if not self._ready_sent:
            self._ready_sent = True
            self.notifier.ready()
        self.notifier.status("serving")

    async def set_not_serving(self, reason: str) -> None:
        """Hard stop (thermal STOPPED/EMERGENCY, engine dead): NOT_SERVING on "" and the inference name."""
        if self.state in (ServiceState.DRAINING,):
            return
        if self.state != ServiceState.NOT_SERVING or reason != self.reason:
            log.warning("service NOT_SERVING: %s", reason)
        self.state, self.reason = ServiceState.NOT_SERVING, reason
        for name in ("", *INFERENCE_SERVICES):
            await self.servicer.set(name, _NOT_SERVING)
        self.notifier.status(f"not serving: {reason}")

    async def set_thermal(self, ok: bool) -> None:
        """Reflect the governor's health on ``appliance.thermal``."""
        if ok != self._thermal_ok and self.state != ServiceState.DRAINING:
            self._thermal_ok = ok
            await self.servicer.set(THERMAL_SERVICE, _SERVING if ok else _NOT_SERVING)

    async def follow_thermal(self, action: HealthAction, reason: str) -> None:
        """Apply the thermal loop's verdict (:func:`appliance.thermal.control.health_action`).

        SERVE keeps everything SERVING; SERVE_DEGRADED (blind) fails only ``appliance.thermal``; PAUSE
        (emergency) and STOP (GPU lost) make the service NOT_SERVING. A thermal NOT_SERVING recovers here too;
        one with another cause (engine dead, a stalled stage) is left to its owner.
        """
        await self.set_thermal(action is HealthAction.SERVE)
        if action in (HealthAction.PAUSE, HealthAction.STOP):
            if self.state == ServiceState.SERVING:
                await self.set_not_serving(reason)
        elif self.state == ServiceState.NOT_SERVING and self.reason.startswith("thermal"):
            await self.set_serving()

    async def set_draining(self) -> None:
        """SIGTERM: STOPPING=1 and every name NOT_SERVING (later sets are ignored by the servicer)."""
        self.state, self.reason = ServiceState.DRAINING, "draining"
        self.notifier.stopping()
        self.notifier.status("draining")
        await self.servicer.enter_graceful_shutdown()
