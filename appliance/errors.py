"""One exception tree. Each class maps to one gRPC status code.

::

    ApplianceError                      (INTERNAL)   base; never raised directly
    ├── InputError                      (INVALID_ARGUMENT)   the request itself is bad
    │   ├── DicomError                  (INVALID_ARGUMENT)   not DICOM, missing/contradictory tag, bad pixels
    │   ├── UnsupportedTransferSyntax   (INVALID_ARGUMENT)   no installed decoder for the syntax
    │   ├── LimitExceeded               (INVALID_ARGUMENT)   pixels/frames/bytes over a configured limit
    │   ├── UnknownPipeline             (NOT_FOUND)          pipeline name not loaded
    │   └── UnknownModel                (NOT_FOUND)          OIP model name or version not served
    ├── NotApplicable                   (FAILED_PRECONDITION) valid DICOM the pipeline cannot use (RT Plan, SR)
    ├── Overloaded                      (RESOURCE_EXHAUSTED) inbox full / deadline cannot be met; retry later
    ├── Unavailable                     (UNAVAILABLE)        warming up, draining, thermal stop; retry later
    ├── DeadlineExceeded                (DEADLINE_EXCEEDED)  the deadline passed before the frame was computed
    ├── ConfigError                     (startup only)       a config key is wrong; names the key
    ├── ManifestError                   (startup only)       model.toml is wrong; names file and key
    │   └── ArtifactIntegrityError      (startup only)       artifact missing or sha256 mismatch; names the file
    ├── EngineError                     (INTERNAL)           recoverable: one batch failed
    │   └── EngineDeadError             (UNAVAILABLE)        unrecoverable: fail health, let systemd restart
    └── BackendUnavailable              (startup only)       a backend's dependencies are missing; names them

Messages name what an operator can fix (the DICOM tag, the config key, the package) and never carry patient
data.
"""

from __future__ import annotations

import grpc

__all__ = [
    "ApplianceError",
    "ArtifactIntegrityError",
    "BackendUnavailable",
    "ConfigError",
    "DeadlineExceeded",
    "DicomError",
    "EngineDeadError",
    "EngineError",
    "InputError",
    "LimitExceeded",
    "ManifestError",
    "NotApplicable",
    "Overloaded",
    "Unavailable",
    "UnknownModel",
    "UnknownPipeline",
    "UnsupportedTransferSyntax",
]


class ApplianceError(Exception):
    """Base of every error the appliance raises on purpose."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    reason: str = "INTERNAL"  # google.rpc.ErrorInfo reason
    counted: bool = False  # set once the request path has counted this request's outcome (metrics)


class InputError(ApplianceError):
    """The request itself is bad, whatever the state of the system."""

    code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "INVALID_INPUT"

    def __init__(self, message: str, field: str = "dicom") -> None:
        super().__init__(message)
        self.field = field  # google.rpc.BadRequest field, e.g. "dicom.TransferSyntaxUID"


class DicomError(InputError):
    """Not DICOM, or a tag is missing, contradictory or out of range, or the pixel data is bad."""

    reason = "INVALID_DICOM"


class UnsupportedTransferSyntax(InputError):
    """No installed decoder handles the transfer syntax; the message names the missing package."""

    reason = "UNSUPPORTED_TRANSFER_SYNTAX"


class LimitExceeded(InputError):
    """Pixels per frame, frames or decoded bytes over a configured limit (checked before allocating)."""

    reason = "LIMIT_EXCEEDED"


class UnknownPipeline(InputError):
    """The requested pipeline is not loaded."""

    code = grpc.StatusCode.NOT_FOUND
    reason = "UNKNOWN_PIPELINE"


class UnknownModel(InputError):
    """An Open Inference Protocol call names a model (or version) this server does not serve."""

    code = grpc.StatusCode.NOT_FOUND
    reason = "UNKNOWN_MODEL"


class NotApplicable(ApplianceError):
    """A valid DICOM object that the pipeline cannot use (no pixels, wrong SOP class, colour for a CT model)."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "NOT_APPLICABLE"


class Overloaded(ApplianceError):
    """The inbox is full, or the queue cannot meet the request's deadline."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "QUEUE_FULL"

    def __init__(self, message: str, retry_after_s: float | None = 0.1, reason: str | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s  # None: retrying cannot help (e.g. a message over the size limit)
        if reason:
            self.reason = reason


class Unavailable(ApplianceError):
    """Warming up, draining or stopped (thermal); the client may retry."""

    code = grpc.StatusCode.UNAVAILABLE
    reason = "UNAVAILABLE"

    def __init__(self, message: str, reason: str = "UNAVAILABLE", retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s


class DeadlineExceeded(ApplianceError):
    """The request's deadline passed while it waited; it was never computed."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED
    reason = "DEADLINE_EXCEEDED"


class ConfigError(ApplianceError):
    """A configuration value is wrong. The message names the key."""

    reason = "BAD_CONFIG"


class ManifestError(ApplianceError):
    """A model manifest is wrong. The message names the file and key."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "BAD_MANIFEST"


class ArtifactIntegrityError(ManifestError):
    """A model artifact is missing or its sha256 does not match the manifest. The message names the file."""

    reason = "ARTIFACT_INTEGRITY"


class EngineError(ApplianceError):
    """One batch failed; the engine is still usable."""

    reason = "ENGINE_ERROR"


class EngineDeadError(EngineError):
    """The engine cannot run any more batches: fail health and let systemd restart the service.

    UNAVAILABLE, like every other frame left when the engine dies: retryable once the service is back. The frames
    of the batch that died had INTERNAL, which a retry policy does not retry (ops review, session 14).
    """

    code = grpc.StatusCode.UNAVAILABLE
    reason = "ENGINE_DEAD"


class BackendUnavailable(ApplianceError):
    """A backend cannot be used here; the message names the missing package or device."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "BACKEND_UNAVAILABLE"
