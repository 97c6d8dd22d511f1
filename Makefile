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
# node_exporter as the latency yardstick, VictoriaMetrics and vmalert, iptables to cut a test job's fabric).
# slurm-wlm and munge: a real one-node Slurm for the health check's tests (tests/test_health_slurm.py).
APT_PACKAGES := prometheus prometheus-alertmanager prometheus-node-exporter victoria-metrics iptables slurm-wlm munge
# Node.js and npm turn @grafana/schema's TypeScript types into the JSON schema the dashboard tests validate
# against (make dashboard-schema); installed only where no node/npm is on the PATH.
NODE_PACKAGES := nodejs npm
GRAFANA_SCHEMA_DIR := tests/grafana_schema
GRAFANA_SCHEMA := $(GRAFANA_SCHEMA_DIR)/dashboard.schema.json
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test bench lint docs rules dashboards helm dashboard-schema deps venv clean flight-dumps proto

# Three distributions from this tree, editable: the training client (client/, no dependency), the daemon (.), and
# its build tools (mixin/: rules, dashboards, chart files, docs, the demo; never in the image).
$(BIN)/.installed: pyproject.toml client/pyproject.toml mixin/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e ./client -e '.[test]' -e './mixin[helm,lint]'
	touch $@

venv: $(BIN)/.installed

deps:
	@if ! command -v promtool >/dev/null || ! command -v prometheus-alertmanager >/dev/null \
	    || ! command -v prometheus-node-exporter >/dev/null || ! command -v vmalert >/dev/null \
	    || ! command -v iptables-legacy >/dev/null || ! command -v slurmctld >/dev/null \
	    || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then \
	  echo "installing Debian packages: $(APT_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	    --no-install-recommends $(APT_PACKAGES) >/dev/null; \
	fi
	@if ! command -v node >/dev/null || ! command -v npm >/dev/null; then \
	  echo "installing Debian packages: $(NODE_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	    --no-install-recommends $(NODE_PACKAGES) >/dev/null; \
	fi

demo: deps venv
	$(BIN)/goodput-exporter demo --exporter-address $(DEMO_ADDRESS) --workdir $(DEMO_DIR) \
	  $(if $(DEMO_FAULTS),--faults $(DEMO_FAULTS))

lint: venv
	$(BIN)/ruff check exporter client mixin tests bench

test: deps venv lint dashboard-schema
	$(BIN)/pytest -q

bench: deps venv
	$(BIN)/python bench/run.py

docs: venv
	$(BIN)/goodput-exporter metrics-doc > docs/metrics.md
	$(BIN)/goodput-exporter config-doc > docs/configuration.md

# Regenerate rules/ from mixin/goodput_mixin/rules/ (defaults); a test fails when the committed files are stale.
rules: venv
	$(BIN)/goodput-exporter rules --out rules
	$(MAKE) -s helm

# Regenerate dashboards/ from mixin/goodput_mixin/dashboards/ (grafana-foundation-sdk); a test fails when they are stale.
dashboards: venv
	$(BIN)/python -m goodput_mixin.dashboards --out dashboards
	$(MAKE) -s helm

# Regenerate the chart's generated files (its copies of the rules and dashboards, values.schema.json) and the
# plain manifests under deploy/ (the chart rendered); tests fail when they are stale. `rules` and `dashboards`
# run it too.
helm: venv
	$(BIN)/python -m goodput_mixin.chart --deploy

# The JSON schema of Grafana's dashboard model, generated from the pinned @grafana/schema's TypeScript types by
# the pinned ts-json-schema-generator (both in $(GRAFANA_SCHEMA_DIR)/package-lock.json); ignored by git.
dashboard-schema: $(GRAFANA_SCHEMA)

$(GRAFANA_SCHEMA): $(GRAFANA_SCHEMA_DIR)/package.json $(GRAFANA_SCHEMA_DIR)/package-lock.json
	cd $(GRAFANA_SCHEMA_DIR) && npm ci --no-audit --no-fund --loglevel=error \
	  && npx --no-install ts-json-schema-generator --no-type-check --type Dashboard \
	    --path node_modules/@grafana/schema/dist/esm/raw/dashboard/x/dashboard_types.gen.d.ts --out $(@F).tmp \
	  && mv $(@F).tmp $(@F)

# Regenerate the kubelet pod-resources gRPC modules from the committed .proto (grpcio-tools, test extra);
# a test fails when the committed modules are stale.
PROTO := exporter/sources/kubelet/podresources_v1.proto
proto: venv
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. $(PROTO)

# Regenerate the real PyTorch flight-recorder dumps the tests read (gloo, CPU; about 30 s).
flight-dumps: venv
	rm -rf tests/flight/dumps
	$(BIN)/python tests/flight/generate.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache bench/.work *.egg-info $(GRAFANA_SCHEMA_DIR)/node_modules $(GRAFANA_SCHEMA)
