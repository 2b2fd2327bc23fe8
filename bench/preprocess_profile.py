"""Bytes-to-slot cost of uncompressed 512x512 CT in one process: thread CPU per file, then a cProfile listing.

    python bench/preprocess_profile.py [N_FILES] [REPS] [SIZE=512]

The same calls a worker makes (``dicom.parse`` + ``Pipeline.check`` + ``Pipeline.run`` into a slot), on synthetic
Explicit VR Little Endian slices of SIZE x SIZE pixels. docs/performance.md quotes its first line.
"""

import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np

from appliance.dicom import parse
from appliance.pipeline.loader import load_pipelines
from appliance.tools import synthetic

n_files = int(sys.argv[1]) if len(sys.argv) > 1 else 8
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 50
size = int(sys.argv[3]) if len(sys.argv) > 3 else 512
repo = Path(__file__).resolve().parents[1]
pipeline = load_pipelines(repo / "pipelines", repo / "models")["ct-nodule"]
files = [synthetic.to_dicom(synthetic.generate_slice(s, size=size)) for s in range(n_files)]
slot = np.zeros(pipeline.input_shape, np.float32)


def one(data: bytes) -> None:
    inst = parse(data)
    pipeline.check(inst)
    pipeline.run(inst, 0, slot)


for data in files:
    one(data)
t0 = time.thread_time()
for _ in range(reps):
    for data in files:
        one(data)
per_file_ms = (time.thread_time() - t0) / (reps * n_files) * 1000
print(f"bytes to slot, {size}x{size}: {per_file_ms:.3f} ms per file (thread CPU)")
profile = cProfile.Profile()
profile.enable()
for _ in range(max(1, reps // 5)):
    for data in files:
        one(data)
profile.disable()
pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
