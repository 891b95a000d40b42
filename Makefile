# Each target is complete on a fresh machine: it creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fitkit-installed

DOCS_STAMP := $(VENV)/.fitkit-docs-installed

.PHONY: demo test lint stress bench docs lowest clean gpu-check gpu-wheels

# Creates .venv when missing and installs fitkit with the extra $(1) (torch pinned by
# constraints.txt), then touches the target stamp; each extra has its own stamp.
define install
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[$(1)]"
	touch $@
endef

# the suite's workers: the tests pin torch to one thread each (tests/conftest.py), so two
# workers use both cores of a 2-core machine; `make test TEST_WORKERS=0` runs in one process
TEST_WORKERS ?= 2

# the tests' extras: `dev`, and `notebook` (a real Jupyter kernel for tests/test_notebook.py)
TEST_EXTRAS := dev,notebook

$(STAMP): pyproject.toml constraints.txt
	$(call install,$(TEST_EXTRAS))

demo: $(STAMP)
	$(PY) examples/digits.py

test: $(STAMP)
	$(PY) -m ruff check fitkit tests benchmarks examples
	$(PY) -m mypy
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope

lint: $(STAMP)
	$(PY) -m ruff check fitkit tests benchmarks examples
	$(PY) -m mypy

# The long repetition loops (forty 2-process runs, many-trial searches) in full; `make test`
# runs a short version of each.
stress: $(STAMP)
	FITKIT_STRESS=1 $(PY) -m pytest -q -m stress

# bench: its own stamp, for the `bench` extra (peer frameworks, matplotlib; torch stays pinned).
BENCH_STAMP := $(VENV)/.fitkit-bench-installed
BENCH_ARGS ?= --plot docs/img/benchmarks.png

$(BENCH_STAMP): pyproject.toml constraints.txt
	$(call install,bench)

bench: $(BENCH_STAMP)
	$(PY) -m benchmarks $(BENCH_ARGS)

$(DOCS_STAMP): pyproject.toml constraints.txt
	$(call install,docs)

# The MkDocs site (material theme, API reference from the docstrings) into site/; --strict
# turns every warning (a broken link, an API name that does not resolve) into a failure.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# lowest: the suite against the lowest versions of fitkit's dependencies that pyproject.toml
# declares (pinned in constraints-lowest.txt), in its own venv; the test tools take whatever
# versions those pins allow. Not part of `make test` (a fresh venv and the whole suite: ~25 min).
LOWEST_VENV := .venv-lowest
LOWEST_PY := $(LOWEST_VENV)/bin/python
LOWEST_STAMP := $(LOWEST_VENV)/.fitkit-installed

$(LOWEST_STAMP): pyproject.toml constraints-lowest.txt
	test -x $(LOWEST_PY) || $(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_PY) -m pip install -q --upgrade pip
	$(LOWEST_PY) -m pip install -q -c constraints-lowest.txt -e ".[$(TEST_EXTRAS)]"
	touch $@

lowest: $(LOWEST_STAMP)
	$(LOWEST_PY) -m pytest -q

# gpu-check: the prepared GPU check (benchmarks/gpu_check.py; docs/scaling.md "GPU"), on a machine with
# one CUDA GPU whose Python has torch, lightning, transformers and accelerate: the wheels carried in
# .whl/ (`make gpu-wheels`, here) are installed into $(GPU_SITE) first; the figures go to one JSON
# file, $(GPU_OUT). `make gpu-check GPU_ARGS=--cpu-dry-run` takes every item's path, tiny, on a CPU.
GPU_PY ?= python3
GPU_SITE ?= /tmp/fitkit-site
GPU_OUT ?= $(if $(OUT),$(OUT),.)/gpu_check.json
GPU_ARGS ?=

gpu-check:
	if ls .whl/*.whl >/dev/null 2>&1; then $(GPU_PY) -m pip install -q --no-index --no-deps --no-compile \
		--no-cache-dir --upgrade --target $(GPU_SITE) .whl/*.whl; fi
	PYTHONPATH=$(GPU_SITE):$(CURDIR) DS_ACCELERATOR=cuda PYTHONUNBUFFERED=1 $(GPU_PY) benchmarks/gpu_check.py \
		--out $(GPU_OUT) $(GPU_ARGS)

gpu-wheels:
	PYTHON=$(PY) bash benchmarks/gpu_wheels.sh

clean:
	rm -rf $(VENV) $(LOWEST_VENV) fitkit.egg-info .pytest_cache site
