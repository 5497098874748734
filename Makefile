# mla.cpp — the everyday commands. See README.md.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all bootstrap configure build test demo bench clean
all: build

bootstrap:
	@bash scripts/bootstrap.sh

configure: bootstrap
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	$(BUILD)/bin/mla demo

bench: build
	$(BUILD)/bin/mla_bench_cpu

clean:
	rm -rf $(BUILD)

# ---- hardening: sanitizers and fuzzing, each in its own build folder (docs/validation.md) ----
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_SEED ?=
SAN_FLAGS = -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
# Left out under the sanitizers: the DeepSeek-V3- and V2-Lite-sized layer cases (tens of seconds
# each optimized). The tiny, odd and mid16 method cases, dispatch, pool and parsers all run.
ASAN_EXCLUDE ?= Methods\.EveryMethodMatchesTheReference/(v3|v2lite)_

.PHONY: test-asan fuzz
test-asan: bootstrap
	@cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMLA_CUDA=OFF \
	  -DMLA_BENCH=OFF -DCMAKE_CXX_FLAGS="$(SAN_FLAGS)" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1" \
	  >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:check_initialization_order=1 \
	  UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS) -E '$(ASAN_EXCLUDE)'

fuzz:
	@bash scripts/bootstrap-fuzz.sh
	@cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1" -DMLA_FUZZ=ON \
	  >/dev/null
	cmake --build $(FUZZ_BUILD) -j $(JOBS)
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_SEED=$(FUZZ_SEED) bash scripts/fuzz.sh $(FUZZ_BUILD)
