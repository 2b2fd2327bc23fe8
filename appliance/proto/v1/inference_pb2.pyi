from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INTERACTIVE: _ClassVar[Priority]
    BATCH: _ClassVar[Priority]
INTERACTIVE: Priority
BATCH: Priority

class AnalyzeRequest(_message.Message):
    __slots__ = ("request_id", "dicom", "pipeline", "priority")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DICOM_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    dicom: bytes
    pipeline: str
    priority: Priority
    def __init__(self, request_id: _Optional[str] = ..., dicom: _Optional[bytes] = ..., pipeline: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ...) -> None: ...

class Finding(_message.Message):
    __slots__ = ("label", "score")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    label: str
    score: float
    def __init__(self, label: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class Location(_message.Message):
    __slots__ = ("row", "column", "score")
    ROW_FIELD_NUMBER: _ClassVar[int]
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    row: float
    column: float
    score: float
    def __init__(self, row: _Optional[float] = ..., column: _Optional[float] = ..., score: _Optional[float] = ...) -> None: ...

class FrameResult(_message.Message):
    __slots__ = ("frame_index", "findings", "location", "lossy")
    FRAME_INDEX_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    LOSSY_FIELD_NUMBER: _ClassVar[int]
    frame_index: int
    findings: _containers.RepeatedCompositeFieldContainer[Finding]
    location: Location
    lossy: bool
    def __init__(self, frame_index: _Optional[int] = ..., findings: _Optional[_Iterable[_Union[Finding, _Mapping]]] = ..., location: _Optional[_Union[Location, _Mapping]] = ..., lossy: _Optional[bool] = ...) -> None: ...

class Model(_message.Message):
    __slots__ = ("name", "version", "precision", "backend", "batch_size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    precision: str
    backend: str
    batch_size: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., precision: _Optional[str] = ..., backend: _Optional[str] = ..., batch_size: _Optional[int] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_ms", "preprocess_ms", "engine_ms", "total_ms")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    PREPROCESS_MS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    preprocess_ms: float
    engine_ms: float
    total_ms: float
    def __init__(self, queue_ms: _Optional[float] = ..., preprocess_ms: _Optional[float] = ..., engine_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class ItemStatus(_message.Message):
    __slots__ = ("code", "message", "reason", "field")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    reason: str
    field: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., reason: _Optional[str] = ..., field: _Optional[str] = ...) -> None: ...

class AnalyzeResponse(_message.Message):
    __slots__ = ("request_id", "sop_instance_uid", "pipeline", "model", "frames", "timings", "status", "item_index")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SOP_INSTANCE_UID_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ITEM_INDEX_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    sop_instance_uid: str
    pipeline: str
    model: Model
    frames: _containers.RepeatedCompositeFieldContainer[FrameResult]
    timings: Timings
    status: ItemStatus
    item_index: int
    def __init__(self, request_id: _Optional[str] = ..., sop_instance_uid: _Optional[str] = ..., pipeline: _Optional[str] = ..., model: _Optional[_Union[Model, _Mapping]] = ..., frames: _Optional[_Iterable[_Union[FrameResult, _Mapping]]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., status: _Optional[_Union[ItemStatus, _Mapping]] = ..., item_index: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Percentiles(_message.Message):
    __slots__ = ("p50", "p90", "p99", "count")
    P50_FIELD_NUMBER: _ClassVar[int]
    P90_FIELD_NUMBER: _ClassVar[int]
    P99_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    p50: float
    p90: float
    p99: float
    count: int
    def __init__(self, p50: _Optional[float] = ..., p90: _Optional[float] = ..., p99: _Optional[float] = ..., count: _Optional[int] = ...) -> None: ...

class Thermal(_message.Message):
    __slots__ = ("enabled", "state", "temperature_c", "duty", "seconds_above_limit", "sensor_errors", "power_w", "reason")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    DUTY_FIELD_NUMBER: _ClassVar[int]
    SECONDS_ABOVE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    SENSOR_ERRORS_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    state: str
    temperature_c: float
    duty: float
    seconds_above_limit: float
    sensor_errors: int
    power_w: float
    reason: str
    def __init__(self, enabled: _Optional[bool] = ..., state: _Optional[str] = ..., temperature_c: _Optional[float] = ..., duty: _Optional[float] = ..., seconds_above_limit: _Optional[float] = ..., sensor_errors: _Optional[int] = ..., power_w: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("state", "uptime_s", "model", "queue_depth", "queue_capacity", "latency_ms", "batch_fill", "status_counts", "thermal", "version", "batches", "degraded_reasons", "pipelines", "default_pipeline", "worker_restarts", "workers")
    class LatencyMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Percentiles
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Percentiles, _Mapping]] = ...) -> None: ...
    class StatusCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STATE_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    QUEUE_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FILL_FIELD_NUMBER: _ClassVar[int]
    STATUS_COUNTS_FIELD_NUMBER: _ClassVar[int]
    THERMAL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_REASONS_FIELD_NUMBER: _ClassVar[int]
    PIPELINES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PIPELINE_FIELD_NUMBER: _ClassVar[int]
    WORKER_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    state: str
    uptime_s: float
    model: Model
    queue_depth: int
    queue_capacity: int
    latency_ms: _containers.MessageMap[str, Percentiles]
    batch_fill: float
    status_counts: _containers.ScalarMap[str, int]
    thermal: Thermal
    version: str
    batches: int
    degraded_reasons: _containers.RepeatedScalarFieldContainer[str]
    pipelines: _containers.RepeatedScalarFieldContainer[str]
    default_pipeline: str
    worker_restarts: int
    workers: int
    def __init__(self, state: _Optional[str] = ..., uptime_s: _Optional[float] = ..., model: _Optional[_Union[Model, _Mapping]] = ..., queue_depth: _Optional[int] = ..., queue_capacity: _Optional[int] = ..., latency_ms: _Optional[_Mapping[str, Percentiles]] = ..., batch_fill: _Optional[float] = ..., status_counts: _Optional[_Mapping[str, int]] = ..., thermal: _Optional[_Union[Thermal, _Mapping]] = ..., version: _Optional[str] = ..., batches: _Optional[int] = ..., degraded_reasons: _Optional[_Iterable[str]] = ..., pipelines: _Optional[_Iterable[str]] = ..., default_pipeline: _Optional[str] = ..., worker_restarts: _Optional[int] = ..., workers: _Optional[int] = ...) -> None: ...
