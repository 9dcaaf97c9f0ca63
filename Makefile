# Entry points. Everything installs what it needs on a fresh machine (Python 3.11+, Go 1.26+).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
TOOLS := .venv-tools
DEV := .venv

.PHONY: demo test up down bench lint clean node-packages release

## demo: the user guide end to end (control plane, a real node with the device plugin, a fake
## heterogeneous node, the operator, the guide's pods, kubectl exec); leaves it running
demo: node-packages $(DEV)/bin/gpushare-dev
	$(DEV)/bin/gpushare-dev demo

## test: lint + unit + property + integration tests (builds the Kubernetes binaries if absent)
test: node-packages $(TOOLS)/bin/tox
	$(TOOLS)/bin/tox run -e lint,unit,integration

## node-packages: the Debian packages of a real node (containerd, runc, CNI), when missing
node-packages:
	harness/node-packages.sh

## release: the versioned artifacts in dist/<version>/ (images, chart, CLI wheel, kubectl
## plugin with its krew manifest, SBOMs, SHA256SUMS); REGISTRY=... names where images go
release: node-packages $(DEV)/bin/gpushare-dev
	$(DEV)/bin/gpushare-dev release --registry $(or $(REGISTRY),localhost/gpushare)

## up: a local control plane with the user guide's GPU node; prints the KUBECONFIG to use
up: $(DEV)/bin/gpushare-dev
	$(DEV)/bin/gpushare-dev up
	$(DEV)/bin/gpushare-dev add-node gpu-node-1 --gpu-memory 89424 --gpu-number 8

## down: stop the local control plane (and the demo's processes)
down: $(DEV)/bin/gpushare-dev
	$(DEV)/bin/gpushare-dev down

## bench: every benchmark (about 30 minutes): report and plots in bench-results/
bench: $(DEV)/bin/gpushare-dev
	$(DEV)/bin/python bench/run.py

lint: $(TOOLS)/bin/tox
	$(TOOLS)/bin/tox run -e lint

$(TOOLS)/bin/tox:
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet "tox==4.67.13"

$(DEV)/bin/gpushare-dev: pyproject.toml harness/pyproject.toml
	$(PYTHON) -m venv $(DEV)
	$(DEV)/bin/pip install --quiet -e '.[dev]' -e ./harness
	touch $@

clean:
	rm -rf $(TOOLS) $(DEV) .tox
