# titan build. `make` builds the binary (cpu backend); `make test` runs every test;
# `make run` trains the embedded default.
#
# Flags are portable by default (CI runs on whatever x86-64 it gets); NATIVE=1 adds
# -O3 -march=native for benchmarks on a known machine, in its own object folder (build/native:
# TITAN=path keeps its binary apart too). CUDA=1 adds the cuda kernels backend
# (kernels/cuda: cuBLASLt, cuDNN, custom kernels) and the NCCL communication backend from
# CUDA_HOME, in its own object folder so that the two flavours never mix objects; the binary is
# still ./titan (TITAN=path puts it elsewhere, as CI does to keep the cpu one).
# SANITIZE=1 builds with AddressSanitizer and UndefinedBehaviorSanitizer (any undefined
# behaviour aborts), in build/sanitize; `make sanitize` builds it and runs the unit tests and
# short 1- and 2-rank trainings under it. `make fuzz` builds tests/fuzz/fuzz_*.c as libFuzzer
# binaries in build/fuzz with clang (scripts/fuzz.sh runs them). EXTRA_CFLAGS / EXTRA_LDFLAGS
# are appended to the compile and link flags.

CC       := mpicc  # HDF5's MPI build's headers include mpi.h
NATIVE   ?= 0
CUDA     ?= 0
CUDA_HOME ?= /usr/local/cuda
BUILD    := build
ifeq ($(CUDA),1)
BUILD    := build/cuda
endif
SANITIZE ?= 0
ifeq ($(SANITIZE),1)
BUILD    := build/sanitize
endif

OPT      := -O2
ifeq ($(NATIVE),1)
OPT      := -O3 -march=native
BUILD    := $(BUILD)/native
endif

PKGS     := yaml-0.1 hdf5-openmpi libpcre2-8 jansson zlib libpng libmicrohttpd libdw
# -fno-math-errno: no code reads errno after a math call, and with it set a loop calling sqrtf
# cannot vectorise (the call may write errno): AdamW's update ran scalar, 4x slower.
CFLAGS   := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror $(OPT) -fno-math-errno -fopenmp -I. \
            $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
# oneDNN (no pkg-config file in Debian) runs the bf16 GEMMs of mixed precision on cpu
# (kernels/cpu/gemm_bf16.c); Debian builds it on libgomp, the OpenMP titan uses.
LDLIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) \
            -ldnnl -lm
LDFLAGS  := -fopenmp
ifeq ($(SANITIZE),1)
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g
CFLAGS   += $(SAN_FLAGS)
LDFLAGS  += $(SAN_FLAGS)
endif
CFLAGS   += $(EXTRA_CFLAGS)
LDFLAGS  += $(EXTRA_LDFLAGS)

LIB_SRCS := $(wildcard core/*.c kernels/*.c kernels/cpu/*.c models/*.c models/*/*.c \
                       optim/*.c data/*.c checkpoint/*.c infer/*.c convert/*.c parallel/*.c \
                       parallel/pp/*.c parallel/cp/*.c parallel/ep/*.c)
LIB_SRCS := $(filter-out parallel/comm_nccl.c,$(LIB_SRCS))
TITAN    ?= titan
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/%.o)
ifeq ($(CUDA),1)
# comm_nccl.c is plain C against the CUDA runtime API and nccl.h. -isystem keeps -Werror to
# titan's own code. The kernels are built for Hopper (sm_90a machine code) with compute_80 PTX
# that the driver compiles for any other GPU from Ampere on.
NVCC      := $(CUDA_HOME)/bin/nvcc
CUDA_ARCH ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=compute_80
NVCCFLAGS := -std=c++17 -O3 $(CUDA_ARCH) -I. -DTITAN_CUDA -Werror all-warnings \
             -Xcompiler -Wall,-Wextra,-Werror,-fopenmp
LIB_SRCS += parallel/comm_nccl.c
CU_SRCS  := $(wildcard kernels/cuda/*.cu)
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/%.o) $(CU_SRCS:%.cu=$(BUILD)/%.o)
CFLAGS   += -DTITAN_CUDA -isystem $(CUDA_HOME)/include
LDLIBS   += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lnccl -lcudnn -lcublas -lcublasLt \
            -lcudart -lstdc++
GPU_TESTS := $(patsubst tests/gpu/%.c,$(BUILD)/tests/%,$(wildcard tests/gpu/test_*.c))
endif
UNIT_TESTS := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(wildcard tests/unit/test_*.c))
TOOLS    := $(patsubst tests/reference/%.c,$(BUILD)/tests/%,$(wildcard tests/reference/*.c))

.PHONY: all test run setup clean check train-default gpu sanitize fuzz flux test-data finetune
all: $(TITAN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

# kernels/traced.c wraps each op of kernels/ops.def, calling it with its arguments by name; the
# C preprocessor cannot take the types off a parameter list, so this list is written here: the
# preprocessor expands ops.def to a line per op, kernels/ops_traced.awk names the arguments.
OPS_TRACED := $(BUILD)/gen/kernels/ops_traced.h
$(OPS_TRACED): kernels/ops.def kernels/ops_traced.awk
	@mkdir -p $(dir $@)
	$(CC) -E -P -x c '-DKERNEL_OP(ret,name,params)=@KERNEL_OP ret|name|params' $< | \
	    awk -f kernels/ops_traced.awk > $@.tmp && mv $@.tmp $@
$(BUILD)/kernels/traced.o build/fuzz/obj/kernels/traced.o: $(OPS_TRACED)
$(BUILD)/kernels/traced.o: CFLAGS += -I$(BUILD)/gen
build/fuzz/obj/kernels/traced.o: FUZZ_CFLAGS += -I$(BUILD)/gen

# The attention tiles' GEMMs sum with fused multiply-adds, as the BLAS kernels they replace
# (kernels/cpu/small_gemm.c), and bf16 attention's softmax rows take their exps with them
# (kernels/cpu/attention_bf16_rows.c); ISO C mode (-std=c11) otherwise forbids contracting
# a * b + c.
$(BUILD)/kernels/cpu/small_gemm.o $(BUILD)/tests/test_small_gemm \
$(BUILD)/kernels/cpu/attention_bf16_rows.o $(BUILD)/kernels/cpu/attention_flash_bf16.o \
$(BUILD)/tests/test_attention_flash: private CFLAGS += -ffp-contract=fast
# bf16 attention's fused forward and softmax rows at -O3 in every build: at -O2 GCC 12 leaves
# some of their 16-lane loops scalar (its cheap vectoriser's cost model), and the portable
# build's bf16 forward took twice the native build's time (the debug model's, one thread,
# AMD EPYC: 10.3 -> 5.2 ms; backward 9.3 -> 8.5). attention.c stays at -O2: the order of its
# fp32 row sums is the vectoriser's, and fp32 keeps its bits.
$(BUILD)/kernels/cpu/attention_bf16_rows.o $(BUILD)/kernels/cpu/attention_flash_bf16.o: \
  private CFLAGS += -O3

$(BUILD)/libtitan.a: $(LIB_OBJS)
	ar rcs $@ $^

TRAIN_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(wildcard train/*.c))

$(TITAN): $(TRAIN_OBJS) $(BUILD)/libtitan.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

# The test binaries' header dependencies, kept out of build/tests, whose test_* run_all.sh runs.
TEST_DEPS = -MMD -MP -MT $@ -MF $(BUILD)/deps/tests/$*.d

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libtitan.a
	@mkdir -p $(dir $@) $(BUILD)/deps/tests
	$(CC) $(CFLAGS) $(TEST_DEPS) $< $(BUILD)/libtitan.a $(shell pkg-config --libs cmocka) $(LDLIBS) $(LDFLAGS) -o $@

$(BUILD)/tests/%: tests/reference/%.c $(BUILD)/libtitan.a
	@mkdir -p $(dir $@) $(BUILD)/deps/tests
	$(CC) $(CFLAGS) $(TEST_DEPS) $< $(BUILD)/libtitan.a $(LDLIBS) $(LDFLAGS) -o $@

# The fault-injecting FUSE file system of test_disk_errors.sh: libfuse3, not titan's library.
$(BUILD)/tests/faultfs: tests/reference/faultfs.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -Wall -Wextra -Werror $(shell pkg-config --cflags fuse3) $< $(shell pkg-config --libs fuse3) -o $@

$(BUILD)/tests/%: tests/gpu/%.c $(BUILD)/libtitan.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(BUILD)/libtitan.a $(LDLIBS) $(LDFLAGS) -o $@

# libFuzzer targets (tests/fuzz/fuzz_*.c) with clang, against the library built with the same
# sanitizers and coverage instrumentation in build/fuzz/obj; mpi.h and libmpi from mpicc, which
# wraps gcc. -Wno-pass-failed: the sanitizers' checks keep clang from vectorizing the kernels'
# `omp simd` loops, which it would otherwise report as an error.
FUZZ_CC    := clang-14
FUZZ_SAN   := -fsanitize=address,undefined -fno-sanitize-recover=undefined \
              -fno-omit-frame-pointer -g
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-pass-failed -O1 -fopenmp -I. \
               $(FUZZ_SAN) \
               $(shell mpicc -showme:compile 2>/dev/null) \
               $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(EXTRA_CFLAGS)
FUZZ_OBJS  := $(filter-out parallel/comm_nccl.c,$(LIB_SRCS))
FUZZ_OBJS  := $(FUZZ_OBJS:%.c=build/fuzz/obj/%.o)
FUZZERS    := $(patsubst tests/fuzz/%.c,build/fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))

build/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

build/fuzz/libtitan.a: $(FUZZ_OBJS)
	ar rcs $@ $^

build/fuzz/%: tests/fuzz/%.c build/fuzz/libtitan.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -MMD -MP $< build/fuzz/libtitan.a $(LDLIBS) \
	    $(shell mpicc -showme:link 2>/dev/null) $(EXTRA_LDFLAGS) -o $@

fuzz: $(FUZZERS)

# The GPU build and its tests' binaries (CUDA=1): what scripts/gpu_check.sh runs on a GPU and
# CI compiles without one.
gpu: $(TITAN) $(GPU_TESTS)

setup:
	@bash scripts/setup.sh

# The sanitizer build's binary, unit tests and tools, then tests/sanitize/run.sh on them.
sanitize: test-data
	@$(MAKE) --no-print-directory SANITIZE=1 TITAN=build/sanitize/titan \
	    build/sanitize/titan $(UNIT_TESTS:$(BUILD)/%=build/sanitize/%)
	@bash tests/sanitize/run.sh

# test and run install what is missing first, then re-enter make so that the pkg-config
# queries above see the freshly installed packages.
test: setup
	@$(MAKE) --no-print-directory check

run: setup
	@$(MAKE) --no-print-directory train-default

check: $(TITAN) $(UNIT_TESTS) $(TOOLS) test-data
	@bash tests/run_all.sh

# The test data (tests/data/README.md) in build/test-data, where the tests, fuzzers and
# benchmarks read it: tests/data's files unpacked, Debian's Austen novels (scripts/
# fetch_austen.sh) and the text derived from them, each file checked against
# tests/data/SHA256SUMS.
TEST_DATA_SRCS := $(filter-out tests/data/README.md tests/data/SHA256SUMS tests/data/%.py, \
                               $(shell find tests/data -type f))
TEST_DATA := $(patsubst tests/data/%,build/test-data/%,$(TEST_DATA_SRCS:.gz=)) \
             build/test-data/corpus/austen.txt

build/test-data/%: tests/data/%.gz
	@mkdir -p $(dir $@)
	gzip -dc $< >$@.tmp && mv $@.tmp $@

build/test-data/%: tests/data/%
	@mkdir -p $(dir $@)
	cp $< $@

build/test-data/janeaustenr.rdb: scripts/fetch_austen.sh
	bash scripts/fetch_austen.sh $@

build/test-data/corpus/austen.txt: build/test-data/janeaustenr.rdb tests/data/austen_text.py
	@mkdir -p $(dir $@)
	/usr/bin/python3 tests/data/austen_text.py $< $@

build/test-data/.checked: $(TEST_DATA) tests/data/SHA256SUMS
	cd build/test-data && sha256sum --quiet --strict -c ../../tests/data/SHA256SUMS
	@touch $@

test-data: build/test-data/.checked

train-default: $(TITAN)
	@bash scripts/run_default.sh

# LoRA on make run's model (training.md's fine-tuning): its checkpoint (make run first when
# missing), a generated instruction set, then the tuned model greeting names it never saw.
finetune: setup $(TITAN)
	@bash scripts/run_finetune.sh

# FLUX on the bundled digits (docs/flux.md): the shards, flux-digits trained for 600
# steps, then a grid of 8 samples of each digit.
FLUX_PROMPTS := $(foreach d,0 1 2 3 4 5 6 7 8 9,--prompt "a handwritten digit $(d)")
flux: $(TITAN)
	/usr/bin/python3 scripts/flux_preprocess.py --digits --out outputs/digits
	rm -rf outputs/flux_digits/checkpoint
	$(abspath $(TITAN)) --config configs/flux_digits.yaml
	$(abspath $(TITAN)) generate --checkpoint outputs/flux_digits/checkpoint/step-600.h5 \
	  --data outputs/digits $(FLUX_PROMPTS) --samples 8 --cfg-scale 4 \
	  --out outputs/flux_digits/samples.png

clean:
	rm -rf build titan

-include $(LIB_OBJS:.o=.d) $(TRAIN_OBJS:.o=.d) $(FUZZ_OBJS:.o=.d) $(FUZZERS:=.d) \
         $(patsubst $(BUILD)/tests/%,$(BUILD)/deps/tests/%.d,$(UNIT_TESTS) $(TOOLS))
