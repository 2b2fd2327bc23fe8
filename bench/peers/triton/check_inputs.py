"""Print the sha256 of the model inputs the appliance's pipeline computes for the DICOM files in a directory.

The bench runs it under the peer's interpreter and compares with its own digest (``appliance.tools.benchcost
.inputs_digest``): equal digests mean both servers feed the model bit-identical inputs.
Usage: PYTHONPATH=<checkout> python check_inputs.py DIR [PIPELINE_TOML]   (default: pipelines/ct-nodule.toml)
"""

import sys
from pathlib import Path

from appliance.pipeline.loader import load_pipeline
from appliance.tools.benchcost import inputs_digest

REPO = Path(__file__).resolve().parents[3]

if __name__ == "__main__":
    folder = Path(sys.argv[1])
    toml = Path(sys.argv[2]) if len(sys.argv) > 2 else REPO / "pipelines" / "ct-nodule.toml"
    pipeline = load_pipeline(toml, REPO / "models")
    files = [p.read_bytes() for p in sorted(folder.glob("*.dcm"))]
    print(inputs_digest(files, pipeline))
