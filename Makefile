# mla.cpp — the everyday commands. See README.md.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# ccache (scripts/bootstrap.sh installs it) under the host compiler of the release and HIP builds:
# their host files mostly preprocess alike, so the HIP build takes them from the cache.
CCACHE = $(shell command -v ccache 2>/dev/null)
CXX_LAUNCHER = $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE))

.PHONY: all bootstrap configure build test demo bench clean
all: build

bootstrap:
	@bash scripts/bootstrap.sh

configure: bootstrap
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CXX_LAUNCHER) $(CMAKE_FLAGS) >/dev/null

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
	  -DMLA_BENCH=OFF -DCMAKE_CXX_FLAGS="$(SAN_FLAGS)" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
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

# ---- the HIP build of the ROCm platform (docs/rocm.md): compiled and linked for AMD GPUs; no AMD
# GPU here, so only what needs no device is run: dispatch works, demo fails cleanly ----
HIP_BUILD ?= build-hip
HIP_ARCHS ?= gfx90a;gfx940
HIP_CMAKE_FLAGS ?= -DMLA_TESTS=OFF

.PHONY: build-hip
build-hip:
	@bash scripts/bootstrap-hip.sh
	@cmake -S . -B $(HIP_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLA_ROCM=ON -DMLA_CUDA=OFF \
	  -DMLA_BENCH=OFF -DMLA_HIP_ARCHS="$(HIP_ARCHS)" $(CXX_LAUNCHER) $(HIP_CMAKE_FLAGS) >/dev/null
	cmake --build $(HIP_BUILD) -j $(JOBS)
	$(HIP_BUILD)/bin/mla dispatch --platform rocm --mode decode --seq-lens 10,20 --prefix-lens 9,19 --json
	@rc=0; $(HIP_BUILD)/bin/mla demo --platform rocm >$(HIP_BUILD)/demo.out 2>$(HIP_BUILD)/demo.err || rc=$$?; \
	  n=$$(wc -l < $(HIP_BUILD)/demo.err); echo "mla demo --platform rocm: exit $$rc, stderr:"; \
	  cat $(HIP_BUILD)/demo.err; \
	  if [ $$rc -ne 1 ] || [ $$n -ne 1 ] || [ -s $(HIP_BUILD)/demo.out ]; then \
	    echo "build-hip: with no device, demo must exit 1 with one stderr line and no stdout" \
	      "(got exit $$rc, $$n stderr lines, $$(wc -c < $(HIP_BUILD)/demo.out) stdout bytes)" >&2; \
	    exit 1; \
	  fi
	@roc-obj-ls $(HIP_BUILD)/bin/mla > $(HIP_BUILD)/code_objects.txt; \
	  echo "code objects in $(HIP_BUILD)/bin/mla (count, target):"; \
	  awk '$$1 ~ /^[0-9]+$$/ {print $$2}' $(HIP_BUILD)/code_objects.txt | sort | uniq -c; \
	  n=$$(grep -c 'host-x86_64' $(HIP_BUILD)/code_objects.txt); \
	  for a in $(subst ;, ,$(HIP_ARCHS)); do \
	    k=$$(grep -cE "amdgcn-amd-amdhsa--$$a([: ]|$$)" $(HIP_BUILD)/code_objects.txt); \
	    if [ $$n -eq 0 ] || [ $$k -ne $$n ]; then \
	      echo "build-hip: $$a code objects in $$k of the $$n HIP objects of bin/mla" >&2; exit 1; \
	    fi; \
	  done

# ---- mutation testing (not in CI): every one-line mutation of tests/mutations.txt must be caught by
# the tests named beside it; a scratch copy of the tree is built CPU-only with ccache ----
.PHONY: mutate
mutate:
	bash scripts/mutate.sh tests/mutations.txt
