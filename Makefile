# edge-appliance: the README's two commands live here.
#   make run   - fresh machine -> .venv with the CPU extra -> `appliance serve` (bundled model, ORT on CPU)
#   make test  - same set-up plus the dev extra -> mypy --strict on appliance/ ([tool.mypy]) -> the whole test suite
#   make bench - the standard side-by-side benchmark (appliance vs a tuned Triton peer): bench.json + PNGs
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
ARGS   ?=

.PHONY: run test setup setup-dev bench bench-quick bench-peer chaos soak proto model eval thermal-sim interop clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.setup-cpu: pyproject.toml | $(BIN)/python
	$(PIP) install -q -e '.[cpu]'
	touch $@

$(VENV)/.setup-dev: pyproject.toml $(VENV)/.setup-cpu
	$(PIP) install -q -e '.[cpu,dev]'
	touch $@

setup: $(VENV)/.setup-cpu
setup-dev: $(VENV)/.setup-dev

run: setup
	$(BIN)/appliance serve $(ARGS)

test: setup-dev
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest $(ARGS)

# The Triton peer's own venv (PyTriton + the same onnxruntime and decoders), outside the runtime deps.
PEER_PY := bench/peers/triton/.venv/bin/python
$(PEER_PY): bench/peers/triton/setup.sh | $(VENV)/.setup-dev
	bench/peers/triton/setup.sh $(BIN)/python

bench-peer: $(PEER_PY)

# Standard set (docs/performance.md): costs, sweep, Poisson, bursts, tuned Triton, self-comparison, plots.
bench: setup-dev bench-peer
	$(BIN)/appliance bench --standard --json bench.json --plot bench $(ARGS)

# The appliance alone: overlap vs --no-overlap, 16 clients.
bench-quick: setup
	$(BIN)/appliance bench --json bench.json $(ARGS)

# Hostile inputs and crashing decoders against a real daemon for DURATION seconds (not in the default tests).
chaos: DURATION ?= 120
chaos: setup-dev
	$(BIN)/appliance chaos --duration $(DURATION) --json chaos.json $(ARGS)

# Leak watch: ~80 % of measured capacity for DURATION seconds, with client cancels and bad inputs
# (appliance/tools/soak.py). Writes soak.json and soak.png.
soak: DURATION ?= 1800
soak: setup-dev
	$(BIN)/python -m appliance.tools.soak --duration $(DURATION) --json soak.json --plot soak.png $(ARGS)

thermal-sim: setup-dev
	$(BIN)/appliance thermal-sim --hours 24 --json thermal-sim.json --plot thermal-sim.png $(ARGS)

# Regenerate the committed gRPC stubs (tests/unit/test_proto.py checks they are current).
proto: setup-dev
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. \
		appliance/proto/v1/inference.proto
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. \
		appliance/proto/inference/grpc_service.proto

# Interop peers that cannot share our venv (tritonclient/PyTriton need protobuf<7) and the Node client.
# Tests build what is missing themselves; CI builds it up front so that nothing skips for want of a download.
interop: setup-dev
	$(BIN)/python -m tests.interop.venvs
	cd tests/interop/node && npm ci --no-audit --no-fund --silent

# Rebuild the reference model from its seed (torch is a build-only extra).
model: setup-dev
	$(PIP) install -q -e '.[cpu,dev,build]'
	$(BIN)/appliance models build ct-nodule $(ARGS)

eval: setup
	$(BIN)/appliance models eval ct-nodule --json $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
