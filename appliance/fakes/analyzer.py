"""A fake of the request-path seam (the ``Analyzer`` protocol of appliance/serving/analyze.py) for front-end tests.

Front ends (the Open Inference Protocol servicer, interop tests) need something that behaves like the real
request path without worker processes or a thermal governor. This fake is faithful where front ends can see
it: it runs a real :class:`~appliance.engines.base.Engine` (the fake engine, or ONNX Runtime) in fixed
batches of B with zero padding on one engine thread, orders waiting rows INTERACTIVE first, bounds its queue
(``Overloaded`` when full), honours ``time_remaining`` (``DeadlineExceeded``), raises the same error classes
as the real path, and reports batches to a :class:`~appliance.batching.batcher.BatchObserver`. ``analyze`` decodes a
DICOM Part-10 file with pydicom (modality LUT, window, area resize) instead of the worker pool.

It records every call (``calls``) so tests can check what a front end passed on: priority, time left,
request id. ``fail_next`` makes the next call raise a given error; ``live``/``ready`` are plain flags.

It returns the contract's own ``ModelInfo``, ``FrameAnalysis`` and ``Analysis`` from :mod:`appliance.serving.analyze`.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from appliance.batching.batcher import BatchObserver
from appliance.batching.work import Priority
from appliance.dicom.syntaxes import LOSSY_SYNTAXES
from appliance.engines.base import Engine
from appliance.errors import (
    ApplianceError,
    DeadlineExceeded,
    DicomError,
    EngineError,
    InputError,
    NotApplicable,
    Overloaded,
    Unavailable,
)
from appliance.serving.analysis import AdmitFrames, Analysis, FrameAnalysis, ModelInfo

__all__ = ["Analysis", "FakeAnalyzer", "FakeCall", "FrameAnalysis", "ModelInfo"]


@dataclass(frozen=True)
class FakeCall:
    """What a front end passed to the analyzer."""

    method: str  # "infer" or "analyze"
    request_id: str
    priority: Priority
    time_remaining: float | None
    pipeline: str = ""
    rows: int = 0
    source: str = ""  # the sender the front end named (its gRPC peer)


@dataclass(order=True)
class _Row:
    priority: int
    seq: int
    data: np.ndarray = field(compare=False)
    future: asyncio.Future[tuple[dict[str, np.ndarray], float, float]] = field(compare=False)
    t_admit: float = field(compare=False, default=0.0)


class FakeAnalyzer:
    """The request path in miniature over a loaded engine. Use from one event loop."""

    def __init__(
        self,
        engine: Engine,
        *,
        version: str = "",
        labels: Sequence[str] = ("no_nodule", "nodule"),
        threshold: float = 0.5,
        window: tuple[float, float] = (-600.0, 1500.0),
        capacity: int = 256,
        observer: BatchObserver | None = None,
    ) -> None:
        self.engine = engine
        outputs = tuple((spec.name, tuple(spec.shape[1:])) for spec in engine.manifest.outputs)
        self._model = ModelInfo(
            name=engine.manifest.name,
            version=version or engine.manifest.version,
            precision=engine.precision,
            backend=engine.backend,
            batch_size=engine.batch_size,
            input_name=engine.input_name,
            item_shape=tuple(engine.item_shape),
            outputs=outputs,
        )
        self.labels = tuple(labels)
        self.threshold = threshold
        self.window = window
        self.capacity = capacity
        self.observer = observer or BatchObserver()
        self.refused: list[str] = []  # codes of requests the front end refused itself (count_refused)
        self.finished: list[str] = []  # codes of requests whose files ran uncounted (count_finished)
        self.live = True
        self.ready = True
        self.fail_next: ApplianceError | None = None
        self.calls: list[FakeCall] = []
        self.batches = 0
        self._queue: list[_Row] = []
        self._seq = 0
        self._engine_thread = ThreadPoolExecutor(1, thread_name_prefix="fake-engine")
        self._decode_thread = ThreadPoolExecutor(1, thread_name_prefix="fake-decode")
        self._running = False

    @property
    def model(self) -> ModelInfo:
        """The served model."""
        return self._model

    def is_live(self) -> bool:
        """The ``live`` flag."""
        return self.live

    def is_ready(self) -> bool:
        """The ``ready`` flag (and live)."""
        return self.live and self.ready

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """A call of several files through the door: refused unless ready; its files skip the check after."""
        if not self.is_ready():
            raise Unavailable("fake analyzer is not ready", reason="NOT_SERVING")
        yield

    def count_refused(self, error: ApplianceError) -> None:
        """Count a request the front end refused itself (``refused`` holds their codes, for tests)."""
        if not error.counted:
            self.refused.append(error.code.name)

    def count_finished(self, code: str, seconds: float | None) -> None:
        """Count a request whose files were analyzed uncounted (``finished`` holds their codes, for tests)."""
        self.finished.append(code)

    def close(self) -> None:
        """Stop the engine and decode threads."""
        self._engine_thread.shutdown(wait=True)
        self._decode_thread.shutdown(wait=True)

    # ---- the two entry points ---------------------------------------------------------------------------

    async def infer(
        self,
        inputs: np.ndarray,
        *,
        request_id: str = "",
        priority: Priority = Priority.BATCH,
        time_remaining: float | None = None,
        source: str = "",
    ) -> list[dict[str, np.ndarray]]:
        """Run preprocessed rows ``[N, *item_shape]`` float32; one dict of per-item outputs per row."""
        self.calls.append(FakeCall("infer", request_id, priority, time_remaining, rows=len(inputs), source=source))
        self._check_call(time_remaining)
        expected = self._model.item_shape
        if inputs.dtype != np.float32 or inputs.ndim != len(expected) + 1 or tuple(inputs.shape[1:]) != expected:
            raise InputError(
                f"input must be float32 [N, {', '.join(map(str, expected))}], got {inputs.dtype} {list(inputs.shape)}",
                field="inputs",
            )
        results = await self._run_rows(list(inputs), priority, time_remaining)
        return [outputs for outputs, _, _ in results]

    async def analyze(
        self,
        dicom: bytes,
        *,
        request_id: str = "",
        pipeline: str = "",
        priority: Priority = Priority.BATCH,
        time_remaining: float | None = None,
        admit_frames: AdmitFrames | None = None,
        wait_for_budget: bool = False,
        source: str = "",
        counted: bool = True,
        entered: bool = False,
    ) -> Analysis:
        """Decode one Part-10 file, run its frames, and label each (``source`` is recorded, not scheduled on).

        ``admit_frames`` is awaited with the frame count before the rows are queued, as the request path does;
        ``wait_for_budget`` is accepted and ignored (this fake has no byte budget); ``entered`` skips the readiness
        check (a file of a call inside :meth:`entered`).
        """
        t0 = time.perf_counter()
        self.calls.append(FakeCall("analyze", request_id, priority, time_remaining, pipeline=pipeline,
                                   source=source))
        self._check_call(time_remaining, ready=not entered)
        loop = asyncio.get_running_loop()
        uid, frames, lossy = await loop.run_in_executor(self._decode_thread, self._decode, dicom)
        if admit_frames is not None and (admitted := await admit_frames(len(frames))) is not None:
            admitted()  # this fake admits at once
        t_pre = time.perf_counter()
        left = None if time_remaining is None else time_remaining - (t_pre - t0)
        results = await self._run_rows(list(frames), priority, left)
        analyses = []
        for index, (outputs, _, _) in enumerate(results):
            analyses.append(self._label(index, outputs, lossy))
        queue_s = max(q for _, q, _ in results)
        engine_s = max(e for _, _, e in results)
        return Analysis(
            request_id=request_id,
            sop_instance_uid=uid,
            pipeline=pipeline or self._model.name,
            frames=tuple(analyses),
            queue_ms=queue_s * 1e3,
            preprocess_ms=(t_pre - t0) * 1e3,
            engine_ms=engine_s * 1e3,
            total_ms=(time.perf_counter() - t0) * 1e3,
        )

    # ---- internals --------------------------------------------------------------------------------------

    def _check_call(self, time_remaining: float | None, ready: bool = True) -> None:
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        if ready and not self.is_ready():
            raise Unavailable("fake analyzer is not ready", reason="NOT_SERVING")
        if time_remaining is not None and time_remaining <= 0:
            raise DeadlineExceeded("the deadline passed before the request was admitted")

    async def _run_rows(
        self, rows: list[np.ndarray], priority: Priority, time_remaining: float | None
    ) -> list[tuple[dict[str, np.ndarray], float, float]]:
        if len(self._queue) + len(rows) > self.capacity:
            self.observer.on_rejected("QUEUE_FULL")
            raise Overloaded(f"queue full ({len(self._queue)}/{self.capacity} rows waiting)")
        loop = asyncio.get_running_loop()
        futures = []
        now = time.perf_counter()
        for row in rows:
            self._seq += 1
            fut: asyncio.Future[tuple[dict[str, np.ndarray], float, float]] = loop.create_future()
            self._queue.append(_Row(int(priority), self._seq, row, fut, now))
            futures.append(fut)
        if not self._running:
            self._running = True
            loop.create_task(self._drain())
        try:
            return list(await asyncio.wait_for(asyncio.gather(*futures), timeout=time_remaining))
        except TimeoutError:
            self._queue = [r for r in self._queue if r.future not in futures]
            raise DeadlineExceeded(f"deadline of {time_remaining:.3f} s passed before the rows were computed") from None

    async def _drain(self) -> None:
        """Launch fixed batches while rows wait: highest priority first, zero padding to B."""
        loop = asyncio.get_running_loop()
        b = self._model.batch_size
        try:
            while self._queue:
                self._queue.sort()
                take, self._queue = self._queue[:b], self._queue[b:]
                batch = np.zeros((b, *self._model.item_shape), dtype=np.float32)
                for i, row in enumerate(take):
                    batch[i] = row.data
                t_launch = time.perf_counter()
                try:
                    outputs, engine_s = await loop.run_in_executor(self._engine_thread, self._run_engine, batch)
                except Exception as e:  # noqa: BLE001 - as the batcher: an engine bug fails this batch, not the loop
                    if not isinstance(e, ApplianceError):
                        e = EngineError(f"engine failed: {type(e).__name__}: {e}")
                    for row in take:
                        if not row.future.done():
                            row.future.set_exception(e)
                    continue
                self.batches += 1
                self.observer.on_batch(len(take), b, engine_s)
                for i, row in enumerate(take):
                    if not row.future.done():
                        row.future.set_result(
                            ({k: v[i].copy() for k, v in outputs.items()}, t_launch - row.t_admit, engine_s)
                        )
        finally:
            self._running = False

    def _run_engine(self, batch: np.ndarray) -> tuple[dict[str, np.ndarray], float]:
        t0 = time.perf_counter()
        outputs = self.engine.run(batch)
        return outputs, time.perf_counter() - t0

    def _decode(self, data: bytes) -> tuple[str, np.ndarray, bool]:
        import pydicom
        from PIL import Image

        try:
            ds = pydicom.dcmread(io.BytesIO(data))
        except Exception as e:  # pydicom raises InvalidDicomError and plain parse errors alike
            raise DicomError(f"not a DICOM Part-10 file: {type(e).__name__}") from None
        if "PixelData" not in ds:
            raise NotApplicable("no Pixel Data (7FE0,0010): nothing to analyze")
        pixels = np.asarray(ds.pixel_array, dtype=np.float32)
        frames = pixels if int(getattr(ds, "NumberOfFrames", 1) or 1) > 1 else pixels[None]
        slope = float(getattr(ds, "RescaleSlope", 1.0) or 1.0)
        intercept = float(getattr(ds, "RescaleIntercept", 0.0) or 0.0)
        center, width = self.window
        rows, cols = self._model.item_shape[-2:]
        out = np.zeros((len(frames), *self._model.item_shape), dtype=np.float32)
        for i, frame in enumerate(frames):
            unit = np.clip((frame * slope + intercept - (center - width / 2.0)) / width, 0.0, 1.0).astype(np.float32)
            if unit.shape != (rows, cols):
                unit = np.asarray(Image.fromarray(unit).resize((cols, rows), Image.Resampling.BOX), dtype=np.float32)
            out[i] = unit.reshape(self._model.item_shape)  # one channel: (1, rows, cols) or (rows, cols)
        lossy = str(ds.get("LossyImageCompression", "")) == "01" or ds.file_meta.TransferSyntaxUID in LOSSY_SYNTAXES
        return str(getattr(ds, "SOPInstanceUID", "")), out, lossy  # lossy as DicomInstance.lossy defines it

    def _label(self, index: int, outputs: dict[str, np.ndarray], lossy: bool = False) -> FrameAnalysis:
        score_name = next(name for name, shape in self._model.outputs if int(np.prod(shape)) <= 1)
        p = float(np.asarray(outputs[score_name]).ravel()[0])
        scores = {self.labels[0]: 1.0 - p, self.labels[1]: p}
        label = self.labels[1] if p >= self.threshold else self.labels[0]
        return FrameAnalysis(frame_index=index, outputs=outputs, label=label, scores=scores, location=None, lossy=lossy)

    @classmethod
    def with_fake_engine(cls, manifest: Any, **options: Any) -> FakeAnalyzer:
        """Build over a loaded :class:`~appliance.engines.fake.FakeEngine` for ``manifest``."""
        from appliance.engines.fake import FakeEngine

        engine = FakeEngine(manifest, manifest.artifact(None), options)
        engine.load()
        return cls(engine)
