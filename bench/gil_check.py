"""Do the decoders and the pipeline release the GIL? Files/s and cores used with 1 and 2 threads in one process.

PyTriton runs model instances as threads of one Python process, so this decides whether a Triton peer with
Python-callable preprocessing can use more than one core for it (docs/performance.md).
Usage: python bench/gil_check.py
"""

from __future__ import annotations

import resource
import threading
import time
from pathlib import Path

import numpy as np

from appliance.dicom import parse
from appliance.pipeline.loader import load_pipeline
from appliance.tools import synthetic

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    pipeline = load_pipeline(REPO / "pipelines" / "ct-nodule.toml", REPO / "models")
    for name, n in (("j2k", 20), ("jpegls", 60), ("native", 200)):
        files = synthetic.workload(name, 4, 3)

        def work(count: int, files: list[bytes] = files) -> None:
            slot = np.zeros(pipeline.input_shape, np.float32)
            for i in range(count):
                inst = parse(files[i % len(files)])
                pipeline.check(inst)
                pipeline.run(inst, 0, slot)

        for threads in (1, 2):
            ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            pool = [threading.Thread(target=work, args=(n,)) for _ in range(threads)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
            wall = time.perf_counter() - t0
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
            print(f"{name:7s} {threads} thread(s): {threads * n / wall:7.1f} files/s, cores used {cpu / wall:.2f}")


if __name__ == "__main__":
    main()
