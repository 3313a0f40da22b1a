# The commands users type. CMake does the real work in build/.
#   make deps    install the Debian packages (deploy/install-deps.sh)
#   make         configure + build into build/
#   make test    deps + build + ctest
#   make demo    deps + build + a local 2-rank ZeRO job on the CPU backend (zerorun, train_mlp)
#   make bench   build + run the benchmarks in bench/
#   make fuzz    build + the long fuzz: live socket, then libFuzzer (ZEROD_FUZZ_SECONDS each)
#   make bench-deepspeed  build + real DeepSpeed 0.19.8 (ZeRO-1, 2, 2+offload) against zerod
#                (bench/ds_vs_zerod.py; the venv of bench/ds_venv.sh is created once, ~6 GB)
#   make test-deepspeed   the same, short: final parameters of every side within 1e-5; then
#                the DeepSpeed example ported by its import (tests/python/test_deepspeed_port.py)
#   make test-torch2      build + the Python tests (ctest -L python) under torch 2.x
#                (the venv of tests/python/torch2_venv.sh, ~5 GB, created once; in build-torch2/)
#   make lint    clang-format, cppcheck, the layers (tools/check_layers.py), the tour docs'
#                names (tools/check_doc_refs.py)
#   make install PREFIX=/usr/local
BUILD       ?= build
PREFIX      ?= /usr/local
JOBS        ?= $(shell nproc)
CMAKE_FLAGS ?=
ifneq ($(CI),)
CMAKE_FLAGS += -DZEROD_WERROR=ON
endif

SOURCES = $(shell git ls-files '*.c' '*.h' '*.cu' '*.cuh' 2>/dev/null)

.PHONY: all deps configure build test bench lint install clean demo fuzz bench-deepspeed \
        test-deepspeed test-torch2

all: build

deps:
	bash deploy/install-deps.sh

# Configured means a cmake configure succeeded: the stamp is written after it, never by a
# failed one (which leaves a CMakeCache.txt and no Makefile behind). A failed configure also
# removes its cache and compiler checks (CMakeFiles/<cmake version>), so that the next run
# configures afresh rather than failing differently; objects of an earlier build stay. Later
# changes to CMakeLists.txt are picked up by `cmake --build` itself.
CONFIGURED = $(BUILD)/.zerod-configured

$(CONFIGURED):
	@rm -f $@
	cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS) || \
	    { rm -rf $(BUILD)/CMakeCache.txt $(BUILD)/CMakeFiles/[0-9]*; \
	      echo "make: cmake could not configure $(BUILD)/ (see above; 'make deps' installs" \
	           "the packages zerod needs)" >&2; exit 1; }
	@touch $@

configure: $(CONFIGURED)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

# test and demo install the packages first: each works on a machine with nothing installed.
# $(MAKE) build, not a prerequisite: under make -j the build must not start before deps ends.
test: deps
	$(MAKE) build
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

bench: build
	cmake --build $(BUILD) --target bench

# DS_ARGS: more options for bench/ds_vs_zerod.py (e.g. --model 350m, --world 4)
DS_ARGS ?=
bench-deepspeed: build
	py=$$(bash bench/ds_venv.sh | tail -n 1) && ZEROD_TEST_DAEMON=$(BUILD)/daemon/zerod \
	    "$$py" bench/ds_vs_zerod.py --zk-bench $(BUILD)/bench/zk_bench $(DS_ARGS)

# Then tests/python/test_deepspeed_port.py: examples/deepspeed_port's DeepSpeed script and its
# one-import port, under torchrun and zerorun (Debian's python3 and torch) against DeepSpeed
# ZeRO-2 from the venv, fp32 and bf16 (about 100 s on 2 cores; the whole target about 3 min,
# venv made). Both run; either failing fails.
test-deepspeed: build
	py=$$(bash bench/ds_venv.sh | tail -n 1) || exit 1; rc=0; \
	ZEROD_TEST_DAEMON=$(BUILD)/daemon/zerod \
	    "$$py" bench/ds_vs_zerod.py --zk-bench $(BUILD)/bench/zk_bench --runs 1 --steps 3 \
	    --warmup 1 --sides ds-zero1,ds-zero2,ds-zero2-offload,zerod --check $(DS_ARGS) || rc=1; \
	ZEROD_DS_PYTHON="$$py" ZEROD_TEST_DAEMON=$(abspath $(BUILD))/daemon/zerod \
	    ZEROD_LIBZC=$(abspath $(BUILD))/client/libzc.so \
	    /usr/bin/python3 tests/python/test_deepspeed_port.py --dtype both || rc=1; \
	exit $$rc

# The Python suite again, under torch 2.x (make test: Debian's 1.13). Their interpreter is a
# configure-time choice (ZEROD_TORCH_PYTHON, tests/python/CMakeLists.txt), so they run from a
# build dir of their own configured with the venv's python; $(BUILD) is left as it is.
TORCH2_BUILD ?= build-torch2
test-torch2: build
	py=$$(bash tests/python/torch2_venv.sh) && \
	cmake -S . -B $(TORCH2_BUILD) -DZEROD_TORCH_PYTHON="$$py" $(CMAKE_FLAGS) && \
	cmake --build $(TORCH2_BUILD) -j$(JOBS) && \
	ctest --test-dir $(TORCH2_BUILD) --output-on-failure -j$(JOBS) -L python

# The long fuzz (ctest runs 10 s of the first): tests/integration/live_fuzz.sh against a daemon
# of its own, then the libFuzzer target over the frame decoder (tests/fuzz) where clang built
# it; both run, either failing fails. ZEROD_FUZZ_SEED replays a live run.
ZEROD_FUZZ_SECONDS ?= 120
fuzz: build
	@rc=0; \
	tests/integration/live_fuzz.sh $(BUILD)/daemon/zerod $(BUILD)/client/zeroctl \
	    $(BUILD)/examples/train_mlp $(BUILD)/tests/integration/zd_live_fuzz \
	    $(BUILD)/fuzz-live $(ZEROD_FUZZ_SECONDS) || rc=1; \
	if [ -x $(BUILD)/tests/fuzz/zd_fuzz_ipc ]; then \
	    (cd $(BUILD)/tests/fuzz && mkdir -p corpus-long seeds && ./zd_fuzz_gen_seeds seeds && \
	     ./zd_fuzz_ipc -max_total_time=$(ZEROD_FUZZ_SECONDS) -rss_limit_mb=2048 \
	         -print_final_stats=1 corpus-long seeds) || rc=1; \
	else \
	    echo "fuzz: no libFuzzer target in $(BUILD)/tests/fuzz (clang not found): skipped"; \
	fi; \
	exit $$rc

demo: deps
	$(MAKE) build
	ZEROD_BUILD=$(BUILD) $(BUILD)/client/zerorun --nproc 2 --spawn-daemons -- sh examples/demo.sh

lint:
	@echo "clang-format: $(words $(SOURCES)) files"
	@clang-format --dry-run --Werror $(SOURCES)
	@echo "cppcheck: $(words $(filter %.c,$(SOURCES))) files"
	@cppcheck --quiet --error-exitcode=1 --enable=warning,portability --inline-suppr \
	    --suppress=missingIncludeSystem --suppress=unknownMacro --std=c11 \
	    -I common/include -I kernels/include -I client/include \
	    $(filter %.c,$(SOURCES))
	@python3 tools/check_layers.py $(if $(wildcard $(BUILD)/CMakeCache.txt),--objects $(BUILD))
	@python3 tools/check_doc_refs.py
	@echo "lint: clean"

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD)
