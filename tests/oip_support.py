"""A loopback ``inference.GRPCInferenceService`` over the FakeAnalyzer, served from its own event-loop thread.

Interop tests take an *address* (fixture ``oip_target``), so the same client scripts can be pointed at a real
daemon once the servicer is wired into ``appliance serve``.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import grpc

from appliance.engines.fake import FakeEngine
from appliance.fakes.analyzer import FakeAnalyzer
from appliance.manifest import load_manifest
from appliance.serving import oip, oip_wire


class LoopbackOip:
    """FakeAnalyzer (fake engine, model ``ct-nodule`` from ``models_dir``) behind a grpc.aio server on 127.0.0.1."""

    def __init__(self, models_dir: Path, *, engine_options: dict[str, Any] | None = None) -> None:
        manifest = load_manifest(models_dir / "ct-nodule" / "model.toml")
        engine = FakeEngine(manifest, manifest.artifact(None), engine_options or {})
        engine.load()
        self.engine = engine
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.analyzer, self.server, port = self.call(self._start())
        self.address = f"127.0.0.1:{port}"

    async def _start(self) -> tuple[FakeAnalyzer, grpc.aio.Server, int]:
        analyzer = FakeAnalyzer(self.engine)
        server = grpc.aio.server()
        oip.add_to_server(server, analyzer)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return analyzer, server, port

    def call(self, coro: Any) -> Any:
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def stop(self) -> None:
        """Stop the server and the loop."""
        self.call(self.server.stop(1.0))
        self.analyzer.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def dicom_infer_request(files: list[bytes], request_id: str = "") -> Any:
    """A ModelInfer request for the DICOM view (``ct-nodule-dicom``) carrying ``files`` in raw BYTES contents."""
    from appliance.proto.inference import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name="ct-nodule-dicom", id=request_id)
    request.inputs.add(name="dicom", datatype="BYTES", shape=[len(files)])
    request.raw_input_contents.append(oip_wire.serialize_bytes(files))
    return request
