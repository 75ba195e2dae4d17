# The two commands of the README's quick start, and their helpers.
#   make demo   installs what is missing, builds, runs the main job on a built-in default, and
#               ends with SmolLM2-135M answering chat prompts, plain and speculative
#   make test   installs what is missing, builds, runs every test
#   make python-test   `pip install .` into a fresh virtual environment, then the Python tests
BUILD_DIR ?= build
SANITIZE_DIR ?= build-sanitize
FUZZ_DIR ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZERS = config plan trace gguf safetensors http_body descriptor
JOBS ?= $(shell nproc)
CMAKE_GENERATOR ?= Ninja
DEMO_TARGET ?= qwen3.5-27b
DEMO_DRAFT ?= dflash-qwen3.5-27b
PYTHON ?= python3
PY_VENV ?= build-venv
# ccache (deps/debian-packages.txt; looked up when the recipe runs, after `deps` installed it):
# `pip install .` then compiles the same library objects as `make build` (same flags,
# position-independent for the extension) from its cache.
CCACHE_LAUNCHER = $$(command -v ccache >/dev/null && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

.PHONY: all deps configure build demo test test-sanitize python-test bench fuzz format tidy clean

all: build

# Debian packages, then the real models (SmolLM2's GGUF) into the model cache outside the tree.
deps:
	@./scripts/install-deps.sh
	@./scripts/fetch-models.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -G "$(CMAKE_GENERATOR)" -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_POSITION_INDEPENDENT_CODE=ON $(CCACHE_LAUNCHER)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	./$(BUILD_DIR)/mixkv describe $(DEMO_TARGET) --draft $(DEMO_DRAFT)
	@echo
	./$(BUILD_DIR)/mixkv plan qwen3.5-27b --draft mha-draft-qwen3.5-27b --tp 4 --gpu b300 --compare
	@echo
	./$(BUILD_DIR)/mixkv plan qwen3.5-27b --draft dflash-qwen3.5-27b --tp 2 --gpu h200 --compare
	@echo
	./$(BUILD_DIR)/mixkv simulate gpt-oss-20b --draft eagle3-gpt-oss-20b --requests 200
	@echo
	./$(BUILD_DIR)/mixkv verify qwen3.5-27b --draft mha-draft-qwen3.5-27b --tp 4 --memory-scale 512MiB
	@echo
	./$(BUILD_DIR)/mixkv generate tiny-hybrid --draft mtp --num-spec-tokens 2 --max-tokens 64
	@echo
	./$(BUILD_DIR)/mixkv generate tiny-hybrid --draft tiny-dflash --num-spec-tokens 7 --max-tokens 64
	@echo
	./$(BUILD_DIR)/mixkv generate tiny-swa --draft oracle --num-spec-tokens 4 --max-tokens 128
	@echo
	./$(BUILD_DIR)/mixkv generate smollm2-135m --prompt "Write a short poem about the sea."
	@echo
	@# Prompt lookup on a reply that copies its prompt: same text, tokens/s plain and with the
	@# drafter, and their ratio.
	./$(BUILD_DIR)/mixkv generate smollm2-135m --draft ngram --num-spec-tokens 4 --max-tokens 128 \
	  --prompt "Repeat this text exactly, word for word: The cache keeps every page of every layer \
	in one pool, and the planner decides how large each page is, so that a sliding window layer \
	and a full attention layer can share the same memory without waste."

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# Same tests under AddressSanitizer + UndefinedBehaviorSanitizer (debug info, no benchmarks),
# except the verify sweep over every built-in pair: it runs the same kernels and geometry code as
# the kernel tests, ten times slower under the sanitizers, and `make test` runs it; and the long
# SmolLM2 runs (SmolLm2Long*: llama.cpp agreement, speculation at batch 16), whose code paths the
# short SmolLM2 tests cover there.
test-sanitize: deps
	cmake -S . -B $(SANITIZE_DIR) -G "$(CMAKE_GENERATOR)" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DMIXKV_SANITIZE=ON -DMIXKV_BUILD_BENCH=OFF
	cmake --build $(SANITIZE_DIR) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(SANITIZE_DIR) --output-on-failure -j $(JOBS) -E 'VerifySweep|SmolLm2Long'

# The Python package (docs/python.md): pinned test tools from PyPI, the package built by
# scikit-build-core and nanobind (pinned in pyproject.toml) in build-python/, then its tests.
# The compiler is `make build`'s (scikit-build-core would take Python's own, `g++`, and the
# compiler cache keys its entries by the compiler's name).
python-test: deps
	rm -rf $(PY_VENV)
	$(PYTHON) -m venv $(PY_VENV)
	$(PY_VENV)/bin/pip install --quiet --disable-pip-version-check -r python/requirements-test.txt
	cxx=$$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' $(BUILD_DIR)/CMakeCache.txt 2>/dev/null); \
	  CXX=$${cxx:-c++} CMAKE_CXX_COMPILER_LAUNCHER=$$(command -v ccache || true) \
	  $(PY_VENV)/bin/pip install --quiet --disable-pip-version-check .
	$(PY_VENV)/bin/python -m pytest -q python/tests

bench: build
	./$(BUILD_DIR)/bench/mixkv_bench

# Every libFuzzer target (fuzz/CMakeLists.txt), FUZZ_SECONDS each on its seeds (findings are
# written to the working directory). Not part of CI: the instrumented library alone takes about
# 25 minutes to build on 2 cores.
fuzz:
	@./scripts/install-deps.sh deps/debian-packages-fuzz.txt
	CXX=clang++ cmake -S . -B $(FUZZ_DIR) -G "$(CMAKE_GENERATOR)" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DMIXKV_BUILD_FUZZ=ON -DMIXKV_BUILD_BENCH=OFF
	cmake --build $(FUZZ_DIR) -j $(JOBS) --target $(FUZZERS:%=mixkv_%_fuzzer)
	set -e; for f in $(FUZZERS); do \
	  echo "== mixkv_$${f}_fuzzer, $(FUZZ_SECONDS) s"; \
	  $(FUZZ_DIR)/fuzz/mixkv_$${f}_fuzzer -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 \
	    -print_final_stats=1 $(FUZZ_DIR)/fuzz/corpus-$$f; \
	done

format:
	find include src tests bench fuzz -name '*.hpp' -o -name '*.cpp' | xargs clang-format -i

tidy: configure
	find src -name '*.cpp' | xargs clang-tidy -p $(BUILD_DIR) --quiet

clean:
	rm -rf $(BUILD_DIR) $(SANITIZE_DIR) $(FUZZ_DIR) build-python $(PY_VENV)
