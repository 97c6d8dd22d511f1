# goodput-exporter: `make demo` runs the daemon on simulated GPUs, `make test` installs everything and
# runs the suite, `make bench` writes bench/results.md.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_ADDRESS ?= 127.0.0.1:9445
DEMO_SOCKET ?= /tmp/goodput-exporter-demo/ingest.sock
DEMO_FLIGHT_DIR ?= /tmp/goodput-exporter-demo/flight
# Debian packages the tests and benchmarks run against (promtool, a live Prometheus and Alertmanager,
# node_exporter as the latency yardstick).
APT_PACKAGES := prometheus prometheus-alertmanager prometheus-node-exporter
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test bench lint docs rules deps venv clean flight-dumps

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

demo: venv
	@echo "goodput-exporter with 8 simulated GPUs (Ctrl-C stops it):"
	@echo "  metrics   http://$(DEMO_ADDRESS)/metrics"
	@echo "  health    http://$(DEMO_ADDRESS)/healthz   ready: http://$(DEMO_ADDRESS)/readyz"
	@echo "  training jobs report to unix:$(DEMO_SOCKET) (see README: Instrument your training loop)"
	@echo "  flight-recorder dumps are read from $(DEMO_FLIGHT_DIR)/<workload>/nccl_trace_rank_<rank>"
	@mkdir -p $(DEMO_FLIGHT_DIR)
	$(BIN)/goodput-exporter serve --simulate 8 --web.listen-address $(DEMO_ADDRESS) \
	  --ingest.socket-path $(DEMO_SOCKET) --flight.dir $(DEMO_FLIGHT_DIR)

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

# Regenerate the real PyTorch flight-recorder dumps the tests read (gloo, CPU; about 30 s).
flight-dumps: venv
	rm -rf tests/flight/dumps
	$(BIN)/python tests/flight/generate.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache bench/.work *.egg-info
