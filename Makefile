# goodput-exporter: `make demo` runs the live stack (daemon on simulated GPUs, a simulated training job,
# Prometheus with the rules, Alertmanager), `make test` installs everything and runs the suite,
# `make bench` writes bench/results.md.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_ADDRESS ?= 127.0.0.1:9445
DEMO_DIR ?= /tmp/goodput-exporter-demo
# e.g. make demo DEMO_FAULTS=straggler,stall,skip,xid
DEMO_FAULTS ?=
# Debian packages the tests and benchmarks run against (promtool, a live Prometheus and Alertmanager,
# node_exporter as the latency yardstick).
APT_PACKAGES := prometheus prometheus-alertmanager prometheus-node-exporter
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test bench lint docs rules deps venv clean flight-dumps proto

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

venv: $(BIN)/.installed

deps:
	@if ! command -v promtool >/dev/null || ! command -v prometheus-alertmanager >/dev/null \
	    || ! command -v prometheus-node-exporter >/dev/null; then \
	  echo "installing Debian packages: $(APT_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	    --no-install-recommends $(APT_PACKAGES) >/dev/null; \
	fi

demo: deps venv
	$(BIN)/goodput-exporter demo --exporter-address $(DEMO_ADDRESS) --workdir $(DEMO_DIR) \
	  $(if $(DEMO_FAULTS),--faults $(DEMO_FAULTS))

lint: venv
	$(BIN)/ruff check exporter tests bench

test: deps venv lint
	$(BIN)/pytest -q

bench: deps venv
	$(BIN)/python bench/run.py

docs: venv
	$(BIN)/goodput-exporter metrics-doc > docs/metrics.md
	$(BIN)/goodput-exporter config-doc > docs/configuration.md

# Regenerate rules/ from exporter/rules/ (defaults); a test fails when the committed files are stale.
rules: venv
	$(BIN)/goodput-exporter rules --out rules

# Regenerate the kubelet pod-resources gRPC modules from the committed .proto (grpcio-tools, test extra);
# a test fails when the committed modules are stale.
PROTO := exporter/attribution/podresources_v1.proto
proto: venv
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. $(PROTO)

# Regenerate the real PyTorch flight-recorder dumps the tests read (gloo, CPU; about 30 s).
flight-dumps: venv
	rm -rf tests/flight/dumps
	$(BIN)/python tests/flight/generate.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache bench/.work *.egg-info
