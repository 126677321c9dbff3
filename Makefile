# Everything a fresh machine needs: Python >= 3.10 with venv, make, Node >= 20 (Azurite), and Go >= 1.26 for
# the AIStore node that the AIS tests run against (built once, cached in
# ~/.cache/wds-datapipes). The virtual environment lives in .venv.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# The newest stack PyTorch maintains: torch 2.15 + torchdata 0.11 (no DataPipes, no DataLoader2).
NEWEST := .venv-newest
NEWEST_INSTALLED := $(NEWEST)/.installed

.PHONY: ffmpeg bench-media setup setup-newest servers train test test-main test-newest test-core bench bench-epochs bench-nodes bench-ais bench-cache bench-write bench-storage bench-stats valgrind lint clean

setup: $(INSTALLED)

# TorchCodec decodes audio and video with the system's FFmpeg libraries (Debian 12: 5.1).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
ffmpeg:
	@ldconfig -p | grep -q 'libavformat\.so\.' || { $(SUDO) apt-get update -qq && \
		$(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ffmpeg; }
	@# curl: the pipe:curl tests of the shard cache and of pipe: commands (skipped without it)
	@command -v curl >/dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl; }

# The installs go through uv (pinned in the constraints files, installed by the venv's own pip): it installs
# each stack in about 30 s where pip took minutes, and it hard-links every file from its one cache
# (~/.cache/uv) instead of unpacking each wheel into a temporary folder and then into the venv. Both stacks
# (CUDA wheels of torch, about 5.5 GB each) then take their size once, and a second clone adds nothing.
# uv has settings of its own: the index and wheel folders a machine gives pip are passed on, and
# --system-certs reads the machine's certificate store as pip does (uv's own roots fail behind a
# TLS-inspecting proxy). Were uv to fail, pip installs the same pins. pip in the venvs is left as the venv
# made it: tests/test_package.py installs the wheel with it.
UV_ENV = $(if $(PIP_INDEX_URL),UV_DEFAULT_INDEX='$(PIP_INDEX_URL)') \
	$(if $(PIP_EXTRA_INDEX_URL),UV_INDEX='$(PIP_EXTRA_INDEX_URL)') \
	$(if $(wildcard $(PIP_FIND_LINKS)),UV_FIND_LINKS='$(PIP_FIND_LINKS)')
# $(call install,venv,constraints,extras); extras with $(COMMA) between them
COMMA := ,
define install
$(1)/bin/python -m pip install --quiet -c $(2) uv
$(UV_ENV) $(1)/bin/uv pip install --quiet --system-certs --python $(1)/bin/python -c $(2) -e '.[$(3)]' || \
	{ echo "uv failed: installing with pip"; $(1)/bin/python -m pip install --quiet -c $(2) -e '.[$(3)]'; }
endef

$(INSTALLED): pyproject.toml constraints.txt | ffmpeg
	$(PYTHON) -m venv $(VENV)
	$(call install,$(VENV),constraints.txt,dev)
	touch $(INSTALLED)

setup-newest: $(NEWEST_INSTALLED)

# The peers some benchmarks compare (the bench extra: litdata, PyAV, S3 clients, the aistore SDK's datasets),
# installed into .venv once and again when the stack is.
BENCH_INSTALLED := $(VENV)/.bench-installed
$(BENCH_INSTALLED): $(INSTALLED)
	$(call install,$(VENV),constraints.txt,dev$(COMMA)bench)
	touch $(BENCH_INSTALLED)

$(NEWEST_INSTALLED): pyproject.toml constraints-newest.txt | ffmpeg
	$(PYTHON) -m venv $(NEWEST)
	$(call install,$(NEWEST),constraints-newest.txt,dev)
	touch $(NEWEST_INSTALLED)

# The main job: digits -> shards -> DataLoader2 (2 workers) -> a small CNN.
train: setup
	$(BIN)/python examples/train_digits.py

# The test servers: the AIStore node and fake-gcs-server built with Go, Azurite installed with npm, each once
# into ~/.cache/wds-datapipes (docs/testing.md). Any Python 3 runs the installer, so it needs no virtual
# environment and runs beside their installs under make -j: the Go builds use the CPU while pip waits on
# the network and the disk.
servers:
	$(PYTHON) tests/object_servers.py install

# The whole suite, AIStore and object-store tests included (the run starts and stops the servers), on the
# tested stack (torch 2.13, torchdata 0.8 with DataLoader2) and then on the newest one. The installs run
# side by side; each stack's tests run in TEST_WORKERS pytest-xdist workers, which share one AIStore
# cluster and one of each emulator for the whole run (tests/shared_servers.py). TEST_JOBS=2 runs the two
# stacks' tests at the same time (each one's output then comes when it ends).
test:
	$(MAKE) --no-print-directory -j3 setup setup-newest servers
	$(MAKE) --no-print-directory -j$(TEST_JOBS) $(if $(filter 1,$(TEST_JOBS)),,--output-sync=target) \
		test-main test-newest

TEST_JOBS ?= 1
TEST_WORKERS ?= 2
# A module's tests stay in one worker (--dist loadfile): its module-scoped fixtures (a cluster of its own,
# generated media, the docs site) are set up once. pytest 9.2 ignores pytest-xdist 3.8's xdist_group.
XDIST = -n $(TEST_WORKERS) --dist loadfile
# Bytecode cached: the suite starts hundreds of Python processes, each of which would compile the library again.
TEST_ENV = env -u PYTHONDONTWRITEBYTECODE

test-main: setup servers
	$(BIN)/ruff check wds_datapipes aisio tests examples benchmarks
	$(TEST_ENV) $(BIN)/python -m pytest -q --durations=25 $(XDIST)

# On torch 2.15 + torchdata 0.11, the tests of what can differ there: the loaders, the pipes (a
# stand-in where torch has no DataPipes), decoding (torchvision 0.29 hands images to TorchCodec),
# exact epochs under the loaders, listing and sharding, the docs and examples, torchdata.nodes over
# s3:// (the local AIStore's S3 API). The tar reader, the
# shard cache, AIStore and the writer use no torch and run on the tested stack only. The tests
# that need DataLoader2 skip.
NEWEST_TESTS := tests/loaders tests/pipes tests/decoding tests/epochs tests/shards/test_listing.py \
	tests/shards/test_sharding_seeds.py tests/shards/test_grouping.py tests/test_docs.py \
	tests/test_examples.py tests/test_webdataset_compat.py tests/test_memory_bounds.py tests/test_limits.py \
	tests/storage/test_object_store_loaders.py::test_torchdata_nodes_read_every_s3_sample_once_per_epoch \
	tests/stats/test_counts.py tests/stats/test_wait.py tests/stats/test_export_profiler.py \
	tests/stats/test_export_tensorboard.py tests/stats/test_watchdog_loaders.py::test_a_hung_read_is_named_under_each_loader
# Of tests/epochs, the pure plans (mixtures, their rules) and the index command use no torch: tested stack only.
NEWEST_SKIP := --ignore=tests/epochs/test_mixture.py --ignore=tests/epochs/test_mixture_rules.py \
	--ignore=tests/epochs/test_shard_index.py --ignore=tests/epochs/test_places_format.py
test-newest: setup-newest servers
	$(TEST_ENV) $(NEWEST)/bin/python -m pytest -q --durations=15 $(XDIST) $(NEWEST_TESTS) $(NEWEST_SKIP)

test-core: setup
	$(BIN)/python -m pytest -q tests --ignore=tests/aisio

# The benchmarks run as modules of the benchmarks/ package; each writes its full output to
# benchmarks/results/<bench>-<date>.txt (docs/speed.md). BENCH_ARGS goes to each: e.g.
# `make bench-write BENCH_ARGS=--quick` proves it runs end to end in seconds.
BENCH_ARGS ?=

# The pipeline rows and the audio and video rows on the tested stack, then the vision recipe under torchdata.nodes
# (only the newest stack has it) beside DataLoader on the same photos.
bench: setup setup-newest $(BENCH_INSTALLED)
	$(BIN)/python -m benchmarks.bench_pipeline $(BENCH_ARGS)
	$(BIN)/python -m benchmarks.bench_media $(BENCH_ARGS)
	$(NEWEST)/bin/python -m benchmarks.bench_nodes $(BENCH_ARGS)

bench-epochs: setup
	$(BIN)/python -m benchmarks.bench_epochs $(BENCH_ARGS)

bench-nodes: setup-newest
	$(NEWEST)/bin/python -m benchmarks.bench_nodes $(BENCH_ARGS)

bench-media: setup $(BENCH_INSTALLED)
	$(BIN)/python -m benchmarks.bench_media $(BENCH_ARGS)

bench-cache: setup
	$(BIN)/python -m benchmarks.bench_cache $(BENCH_ARGS)

# What stats cost when on: stats off and on in paired rounds (wall clock, CPU), and the instructions of
# the fastest path counted by valgrind's callgrind (a 2-core shared machine's clock cannot resolve 1%).
bench-stats: setup valgrind
	$(BIN)/python -m benchmarks.bench_stats $(BENCH_ARGS)

# valgrind (its package holds callgrind.h) and gcc, which builds bench_stats' callgrind marks.
valgrind:
	@command -v valgrind >/dev/null && command -v gcc >/dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends valgrind gcc libc6-dev; }

# Writing shards from 4,000 files of 50-150 KB: ours (1 and 2 processes, with and without the
# index) against webdataset's ShardWriter and cp -r.
bench-write: setup
	$(BIN)/python -m benchmarks.bench_write $(BENCH_ARGS)

bench-ais: setup $(BENCH_INSTALLED)
	$(BIN)/python -m benchmarks.bench_ais $(BENCH_ARGS)

# Object stores on the local AIStore cluster's S3 API: the client libraries, then s3://,
# http://, ais:// and webdataset's pipe:curl / pipe:aws on the same objects. s3fs gets a venv
# of its own: its aiobotocore pins an older botocore than the bench's boto3.
S3FS_VENV := build/venv-s3fs
bench-storage: setup $(BENCH_INSTALLED)
	test -x $(S3FS_VENV)/bin/python || { $(PYTHON) -m venv $(S3FS_VENV) && \
		$(S3FS_VENV)/bin/python -m pip install --quiet s3fs==2026.9.0; }
	$(BIN)/python -m benchmarks.bench_storage --s3fs-python $(S3FS_VENV)/bin/python $(BENCH_ARGS)

# The documentation site: the guides (docs/*.md) and the API reference from the docstrings (docs/api/),
# built by Sphinx into build/docs (open build/docs/index.html). Every warning is an error, a broken
# reference or link and an undocumented public name included; -E reads every page again, so that no
# warning hides in an unchanged one. make test builds it too, in tests/test_docs_site.py.
.PHONY: docs
docs: setup
	$(BIN)/python -m sphinx -b html -E -W --keep-going -q docs build/docs

# ruff, then mypy over the public API (its scope: [tool.mypy] in pyproject.toml).
lint: setup
	$(BIN)/ruff check wds_datapipes aisio tests examples benchmarks
	$(BIN)/mypy

# The wheel and the sdist in dist/, built offline with the pinned setuptools, then checked by twine
# (their metadata and README render as PyPI will show them). tests/test_package.py installs the wheel.
.PHONY: dist
dist: setup
	rm -rf dist
	$(BIN)/python -m build --no-isolation --outdir dist .
	$(BIN)/twine check --strict dist/*

clean:
	rm -rf $(VENV) $(NEWEST) data build dist *.egg-info
