#!/usr/bin/env bash
# Create the Triton peer's own venv (outside the appliance's runtime deps), git-ignored:
#   bench/peers/triton/.venv  with nvidia-pytriton (bundles tritonserver), tritonclient[grpc,http],
#   and the same onnxruntime / pydicom / decoder plugins the appliance uses, plus msgspec for its loaders
#   (versions read from the appliance venv so both servers run the same kernels).
# Usage: bench/peers/triton/setup.sh [APPLIANCE_PYTHON]   (default: .venv/bin/python of the checkout)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
app_py="${1:-$repo/.venv/bin/python}"
base_py="${PYTHON:-python3}"
venv="$here/.venv"
# Same versions as the appliance venv where it has them (numpy excepted: PyTriton pins numpy<2).
pins=$("$app_py" - <<'PY'
from importlib.metadata import version, PackageNotFoundError
for name in ["onnxruntime", "pydicom", "pylibjpeg", "pylibjpeg-libjpeg", "pylibjpeg-openjpeg",
             "pylibjpeg-rle", "pyjpegls", "pillow", "msgspec"]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        print(name)
PY
)
if [ ! -x "$venv/bin/python" ]; then
  "$base_py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi
# PyTriton 0.7.0 (bundles tritonserver 2.51) pins numpy<2, while the decoder plugins' metadata asks for
# numpy>=2. The Python-backend stub's pybind11 reads numpy 1.x descriptors (under numpy 2 it misreads BYTES
# inputs: "unpack_from requires a buffer of at least 1111638598 bytes"), and the plugins, built against the
# numpy 2 headers, run on numpy 1.26. So: dependencies first, then PyTriton and numpy 1.26 without the
# resolver. The bench checks that both venvs compute bit-identical model inputs (docs/performance.md).
# shellcheck disable=SC2086
"$venv/bin/python" -m pip install -q "tritonclient[grpc,http]" $pins \
  "pyzmq>=23.0" "sh>=1.14" "typer>=0.9.0" "typing_inspect>=0.6.0" "wrapt>=1.11" "importlib_metadata>=7.0.1"
"$venv/bin/python" -m pip install -q --no-deps "nvidia-pytriton==0.7.0" "numpy==1.26.4"
"$venv/bin/python" -m pip freeze > "$here/.venv/requirements.lock"
echo "peer venv ready: $venv"
"$venv/bin/python" -c 'import pytriton, onnxruntime, numpy; print("pytriton", __import__("importlib.metadata").metadata.version("nvidia-pytriton"), "onnxruntime", onnxruntime.__version__, "numpy", numpy.__version__)'
