# Everything a fresh machine needs: Python >= 3.10 with venv, make, and Go >= 1.26 for
# the AIStore node that the AIS tests run against (built once, cached in
# ~/.cache/wds-datapipes). The virtual environment lives in .venv.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: setup train test test-core bench bench-ais lint clean

setup: $(INSTALLED)

$(INSTALLED): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(INSTALLED)

# The main job: digits -> shards -> DataLoader2 (2 workers) -> a small CNN.
train: setup
	$(BIN)/python examples/train_digits.py

# The whole suite, AIStore tests included: they start (and stop) a local cluster.
test: setup
	$(BIN)/python -m aisio.cluster install
	$(BIN)/ruff check wds_datapipes aisio tests examples benchmarks
	$(BIN)/python -m pytest -q

test-core: setup
	$(BIN)/python -m pytest -q tests --ignore=tests/aisio

bench: setup
	$(BIN)/python benchmarks/bench_pipeline.py

bench-ais: setup
	$(BIN)/python benchmarks/bench_ais.py

lint: setup
	$(BIN)/ruff check wds_datapipes aisio tests examples benchmarks

clean:
	rm -rf $(VENV) data build *.egg-info
