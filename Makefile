# dflash-pipe: a multi-process DFlash drafter training pipeline over shared memory.
#
#   make                 CPU build (no nvcc needed)
#   make CUDA=1          CUDA build as well (CUDA_ARCH ?= 90)
#   make test            install missing Debian packages, build, run every CPU test
#   make test-gpu        run every GPU test (skips with a line when no GPU is present)
#   make bench           run every benchmark (tables on stdout, JSON under bench/results/)
#   make run             set up and run the embedded default (configs/tiny.json, CPU)
#   make SANITIZE=address|undefined|thread   build with a sanitizer (separate build dir)
#   make DEPS_PREFIX=.deps/root              use libuv/jansson/libcrypto unpacked by scripts/fetch_deps.sh
#                                            (static link; for the GPU machine, which has no apt)
#
# Conventions (the build finds files by name, so adding a file needs no Makefile edit):
#   common/*.c                   -> build/libbase.a     (util, sha256, rng_fill, par, json_num)
#   common/<layer>/*.c           -> build/lib<layer>.a  (layer: ipc, nn, io, proc, target, dflash)
#   <room>/*.c                   -> build/lib<room>.a, except *_main.c  (room: eval,
#                                   orchestrator, target_worker, postproc_worker, drafter_worker)
#   <room>/<name>_main.c         -> build/bin/<name>, linked with only the layers <room> may use
#                                   (<room>_USES below; a new room needs a _USES line)
#   tests/test_*.c               -> build/tests/test_*        (run by `make test`)
#   tests/<name>_main.c          -> build/bin/<name>          (programs tests launch: fake_worker)
#   tests/gpu_test_*.c|.cu       -> build/tests/gpu_test_*    (CUDA=1, run by `make test-gpu`)
#   bench/*/bench_*.c|.cu        -> build/bench/bench_*       (run by `make bench`)
#   fuzz/fuzz_*.c                -> libFuzzer targets (`make fuzz`, clang)
#   *_cuda.c, *.cu               -> compiled only when CUDA=1
#   *_nocuda.c                   -> compiled only when CUDA=0 (the "not built with CUDA" side of a seam)

CUDA      ?= 0
CUDA_ARCH ?= 90
CUDA_HOME ?= /usr/local/cuda
SANITIZE  ?=
comma := ,
DEPS_PREFIX ?=
OPT       ?= -O2
CC        ?= cc
NVCC      ?= $(CUDA_HOME)/bin/nvcc

ifneq ($(filter-out 0 1,$(CUDA)),)
$(error CUDA must be 0 or 1, got '$(CUDA)')
endif
ifneq ($(filter-out address undefined thread,$(SANITIZE)),)
$(error SANITIZE must be empty, address, undefined or thread, got '$(SANITIZE)')
endif
ifneq ($(DEPS_PREFIX),)
ifeq ($(wildcard $(DEPS_PREFIX)/usr/include/uv.h),)
$(error DEPS_PREFIX=$(DEPS_PREFIX) has no usr/include/uv.h: run scripts/fetch_deps.sh first)
endif
ifeq ($(wildcard $(DEPS_PREFIX)/usr/include/openssl/evp.h),)
$(error DEPS_PREFIX=$(DEPS_PREFIX) has no usr/include/openssl/evp.h: run scripts/fetch_deps.sh again (it now fetches libssl-dev))
endif
endif

BUILD_ROOT ?= build
BUILD := $(BUILD_ROOT)
ifneq ($(SANITIZE),)
BUILD := $(BUILD_ROOT)-$(SANITIZE)
endif
ifeq ($(CUDA),1)
BUILD := $(BUILD)-cuda
endif

WARN    := -Wall -Wextra -Wstrict-prototypes -Wshadow -Wno-unused-parameter -Wpointer-arith -Wvla
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=gnu11 $(WARN) -MMD -MP -D_GNU_SOURCE -I. -Icommon -pthread -fno-strict-aliasing
LDLIBS  := -lm -pthread -lrt
ifneq ($(DEPS_PREFIX),)
# Debian keeps OpenSSL's configuration.h under the multiarch include dir. Static libcrypto
# needs -ldl (its provider loader) and -pthread (already above), and no libssl3 on the host.
DEPS_LIB := $(DEPS_PREFIX)/usr/lib/x86_64-linux-gnu
CFLAGS  += -I$(DEPS_PREFIX)/usr/include -I$(DEPS_PREFIX)/usr/include/x86_64-linux-gnu
LDLIBS  += $(DEPS_LIB)/libuv_a.a $(DEPS_LIB)/libjansson.a $(DEPS_LIB)/libcrypto.a -ldl
else
LDLIBS  += -luv -ljansson -lcrypto
endif
ifneq ($(SANITIZE),)
# GCC's "undefined" leaves out float-cast-overflow (a double past int converted to int), the
# bug class fuzz/fuzz_hfconfig.c found: ask for it too
SANITIZE_FLAGS := -fsanitize=$(SANITIZE)$(if $(filter undefined,$(SANITIZE)),$(comma)float-cast-overflow)
CFLAGS  += $(SANITIZE_FLAGS) -fno-omit-frame-pointer
LDFLAGS += $(SANITIZE_FLAGS)
endif

NVCCFLAGS := -O3 -g -std=c++17 -arch=sm_$(CUDA_ARCH) -I. -Icommon -Xcompiler -Wall,-fno-strict-aliasing -MMD -MP \
             -D_GNU_SOURCE --expt-relaxed-constexpr -lineinfo
# The CUDA libraries go only to the programs that use the GPU (prog_ldlibs, below).
CUDA_LDLIBS :=
ifeq ($(CUDA),1)
CFLAGS  += -DDF_WITH_CUDA=1 -I$(CUDA_HOME)/include
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lcuda -lnccl -lstdc++ -ldl
endif

# --- source discovery and layers -------------------------------------------
.DEFAULT_GOAL := all
# A room is a folder built into one library (every .c/.cu but *_main.c) plus its programs.
# The layers, lowest first; a room may use its own code and the rooms in its _USES line,
# nothing else. Programs link exactly those libraries in that order, without
# --start-group: a call upward or sideways is an undefined symbol at link time, and
# tests/test_layering.sh refuses an #include across the same lines (`make print-layers`).
# A _USES line names every layer below that the room reaches, directly or through another
# (io uses ipc, so whatever uses io lists ipc too), highest first: it is the link order
# (the test checks both). docs/layers.md draws them (scripts/layers.py).
#   base            common/*.c: util, sha256, rng_fill, par, json_num; ckmath.h, cuda_check.h
#   ipc             common/ipc/: shared memory, rings, handoffs, ledger, status, all-reduce
#   nn              common/nn/: the layer library (CPU and CUDA kernels)
#   io              common/io/: files and formats (topology, safetensors, HF config, shards,
#                   metrics); a batch in a slot (an arena of ipc), a stage's figures (a ring's)
#   proc            common/proc/: the process skeleton: ctl (a worker's side of the
#                   orchestrator protocol) and worker (start, rings, metrics, waits, close)
#   target, dflash  common/target/ (the target model), common/dflash/ (the DFlash model)
#   eval            eval/: evaluation and generation (dflash_eval, validator, target_generate, dflash_logits)
#   the processes   orchestrator/ target_worker/ postproc_worker/ drafter_worker/
ROLES   := orchestrator target_worker postproc_worker drafter_worker
# the layers under common/, each in its own folder (common/ itself is base)
COMMON_LAYERS := ipc nn io proc target dflash
ROOMS   := base $(COMMON_LAYERS) eval $(ROLES)
base_DIR := common
$(foreach r,$(COMMON_LAYERS),$(eval $(r)_DIR := common/$(r)))
$(foreach r,eval $(ROLES),$(eval $(r)_DIR := $(r)))
base_USES            :=
ipc_USES             := base
nn_USES              := base
io_USES              := nn ipc base
proc_USES            := io nn ipc base
target_USES          := io nn ipc base
dflash_USES          := io nn ipc base
eval_USES            := dflash target proc io nn ipc base
orchestrator_USES    := io nn ipc base
target_worker_USES   := target proc io nn ipc base
postproc_worker_USES := dflash proc io nn ipc base
drafter_worker_USES  := dflash target proc io nn ipc base

ifeq ($(CUDA),1)
  src_filter = $(filter-out %_nocuda.c,$(1))
else
  src_filter = $(filter-out %_cuda.c,$(1))
endif
# common/ (base) is searched recursively, but its layer folders are rooms of their own
base_FIND := find common $(foreach r,$(COMMON_LAYERS),-path common/$(r) -prune -o)
room_find  = $(shell $(if $(filter base,$(1)),$(base_FIND),find $($(1)_DIR) -maxdepth 1) -name '$(2)' -print 2>/dev/null | sort)

define room_template
$(1)_ALL  := $$(call src_filter,$$(call room_find,$(1),*.c))
$(1)_MAIN := $$(filter %_main.c,$$($(1)_ALL))
$(1)_LIBC := $$(filter-out %_main.c,$$($(1)_ALL))
$(1)_CU   := $$(if $$(filter 1,$$(CUDA)),$$(call room_find,$(1),*.cu))
$(1)_O    := $$($(1)_LIBC:%.c=$$(BUILD)/%.o) $$($(1)_CU:%.cu=$$(BUILD)/%.cu.o)
$(1)_LIB  := $$(if $$(strip $$($(1)_O)),$$(BUILD)/lib$(1).a)
$(1)_BINS := $$(patsubst $$($(1)_DIR)/%_main.c,$$(BUILD)/bin/%,$$($(1)_MAIN))
endef
$(foreach r,$(ROOMS),$(eval $(call room_template,$(r))))
# The release's modeling file (common/dflash/dflash.py) is compiled into libdflash.a as a
# byte array (scripts/embed_file.sh), so dflash_export_release writes it from any binary,
# with or without the source tree beside it.
dflash_O += $(BUILD)/gen/dflash_py.o
# what a room's programs link, in order: its own library, then its _USES
$(foreach r,$(ROOMS),$(eval $(r)_LINK := $($(r)_LIB) $(foreach u,$($(r)_USES),$($(u)_LIB))))

# Host-only programs: they never load CUDA, in either build, so they start on a host without
# a GPU driver (libcuda.so.1) and a GPU fault cannot take them down. The orchestrator hands
# every GPU job to cuda_helper (a separate process, which links CUDA), and dfctl only talks
# to its socket. In a CUDA=1 build they link the "not built with CUDA" side of common/'s
# seams (common/**/*_nocuda.c, compiled for them under $(BUILD)/host/) ahead of the libraries,
# so the CUDA side in the archive is never pulled in; an object that still wanted a CUDA
# symbol would fail their link (no CUDA library on it). tests/test_host_only.sh checks with ldd.
HOST_ONLY_BINS := orchestrator dfctl
HOST_SEAM_O    := $(if $(filter 1,$(CUDA)),$(patsubst %.c,$(BUILD)/host/%.o,$(foreach r,base $(COMMON_LAYERS),$(call room_find,$(r),*_nocuda.c))))
prog_seams      = $(if $(filter $(1),$(HOST_ONLY_BINS)),$(HOST_SEAM_O))
prog_ldlibs     = $(LDLIBS) $(if $(filter $(1),$(HOST_ONLY_BINS)),,$(CUDA_LDLIBS))

define lib_rule
ifneq ($$($(1)_LIB),)
$$($(1)_LIB): $$($(1)_O)
	@mkdir -p $$(@D)
	rm -f $$@; $$(AR) rcs $$@ $$^
endif
# a static pattern over this room's own programs: an object left behind by a file that
# moved to another room can never satisfy it
$$($(1)_BINS): $$(BUILD)/bin/%: $$(BUILD)/$$($(1)_DIR)/%_main.o $$($(1)_LINK)
	@mkdir -p $$(@D)
	$$(CC) $$(LDFLAGS) -o $$@ $$< $$(call prog_seams,$$*) $$($(1)_LINK) $$(call prog_ldlibs,$$*)
endef
$(foreach r,$(ROOMS),$(eval $(call lib_rule,$(r))))
$(foreach b,$(HOST_ONLY_BINS),$(BUILD)/bin/$(b)): $(HOST_SEAM_O)

# Tests, benchmarks and test programs may use every layer: highest first.
ALL_LIBS  := $(foreach r,$(ROLES) eval dflash target proc io nn ipc base,$($(r)_LIB))
LINK_LIBS := $(ALL_LIBS)
NV_LINK_LIBS := $(ALL_LIBS)

# tests/<name>_main.c: helper programs the tests launch (e.g. the fake worker) -> build/bin/<name>
TEST_MAIN := $(call src_filter,$(wildcard tests/*_main.c))
TEST_BINS := $(patsubst tests/%_main.c,$(BUILD)/bin/%,$(TEST_MAIN))
BINS      := $(foreach r,$(ROOMS),$($(r)_BINS)) $(TEST_BINS)

TEST_C    := $(sort $(wildcard tests/test_*.c))
TESTS     := $(TEST_C:tests/%.c=$(BUILD)/tests/%)
ifeq ($(CUDA),1)
GPU_TEST_SRC := $(sort $(wildcard tests/gpu_test_*.c tests/gpu_test_*.cu))
else
GPU_TEST_SRC :=
endif
GPU_TESTS := $(addprefix $(BUILD)/tests/,$(basename $(notdir $(GPU_TEST_SRC))))
BENCH_C   := $(sort $(wildcard bench/*/bench_*.c))
ifeq ($(CUDA),1)
BENCH_CU  := $(sort $(wildcard bench/*/bench_*.cu))
else
BENCH_CU  :=
endif
BENCHES   := $(addprefix $(BUILD)/bench/,$(basename $(notdir $(BENCH_C) $(BENCH_CU))))


# keep the *_main.o intermediates (no relink on every make)
.SECONDARY:
.PHONY: all test test-gpu bench run deps fuzz clean print-config print-layers help
all: print-config $(BINS) $(TESTS) $(GPU_TESTS) $(BENCHES)

help:
	@sed -n '1,26p' Makefile | sed 's/^# \{0,1\}//'

print-config:
	@echo "config: CUDA=$(CUDA) CUDA_ARCH=$(CUDA_ARCH) SANITIZE=$(or $(SANITIZE),none) DEPS_PREFIX=$(or $(DEPS_PREFIX),system) BUILD=$(BUILD)"

# one line per room: its folder and the folders it may include from (tests/test_layering.sh)
print-layers:
	@$(foreach r,$(ROOMS),echo "$($(r)_DIR): $($(r)_DIR) $(foreach u,$($(r)_USES),$($(u)_DIR))";)

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<

# the host-only programs' side of common/'s CUDA seams (HOST_SEAM_O, CUDA=1 builds only)
$(BUILD)/host/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<

# The CPU reference layers are the hot loops of the CPU backend: let the compiler vectorise them,
# and never fuse a multiply and an add (the AVX copies of the loops, common/nn/isa.c, must give the
# baseline's bits; FMA would round once where they round twice).
# bench_nn_cpu times them against the plain loops (tests/nn_plain.h) it compiles itself: same flags.
$(BUILD)/common/nn/%.o: CFLAGS += -O3 -ffp-contract=off
$(BUILD)/bench/bench_nn_cpu: CFLAGS += -O3 -ffp-contract=off

$(BUILD)/gen/dflash_py.c: common/dflash/dflash.py scripts/embed_file.sh
	@mkdir -p $(@D)
	scripts/embed_file.sh dflash_modeling_py $< > $@.tmp && mv $@.tmp $@

$(BUILD)/gen/%.o: $(BUILD)/gen/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

# attention.cu carries a warpgroup-MMA (wgmma) kernel, an sm_90a instruction: with
# CUDA_ARCH 90 that one file is built for sm_90a (runs on sm_90 devices only, as the rest
# of an sm_90 build) with NN_ATTN_WGMMA set; any other arch builds it without the kernel
# (its tiles fall back to the mma.sync one).
ifeq ($(CUDA_ARCH),90)
$(BUILD)/common/nn/attention.cu.o: NVCCFLAGS := $(subst -arch=sm_90,-arch=sm_90a,$(NVCCFLAGS)) -DNN_ATTN_WGMMA=1
endif

$(BUILD)/bin/%: tests/%_main.c $(ALL_LIBS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LINK_LIBS) $(LDLIBS) $(CUDA_LDLIBS)

$(BUILD)/tests/%: tests/%.c $(ALL_LIBS) | $(BINS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LINK_LIBS) $(LDLIBS) $(CUDA_LDLIBS)

$(BUILD)/tests/gpu_test_%: tests/gpu_test_%.cu $(ALL_LIBS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(NV_LINK_LIBS) $(filter-out -pthread,$(LDLIBS) $(CUDA_LDLIBS)) -Xcompiler -pthread

$(BUILD)/bench/%: bench/*/%.c $(ALL_LIBS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LINK_LIBS) $(LDLIBS) $(CUDA_LDLIBS)

$(BUILD)/bench/%: bench/*/%.cu $(ALL_LIBS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(NV_LINK_LIBS) $(filter-out -pthread,$(LDLIBS) $(CUDA_LDLIBS)) -Xcompiler -pthread

# --- entry points -------------------------------------------------------------
deps:
	@scripts/install_deps.sh

test: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) tests/run_tests.sh cpu

test-gpu:
	@if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then \
	  echo "test-gpu: SKIPPED: no NVIDIA GPU on this machine (nvidia-smi -L failed)"; exit 0; fi; \
	$(MAKE) --no-print-directory CUDA=1 all && BUILD=$(BUILD)$(if $(filter 1,$(CUDA)),,-cuda) tests/run_tests.sh gpu

bench: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) bench/run_benches.sh

run: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) scripts/run_default.sh

fuzz:
	@scripts/fuzz.sh

clean:
	rm -rf $(BUILD_ROOT) $(BUILD_ROOT)-*

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
