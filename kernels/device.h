// What a device does per second: the table --estimate predicts a step's time from
// (kernels/step_time.h) and MFU divides by. A GPU's row is kept in kernels/device_table.c with where
// its numbers came from and when; a cpu has no fixed row (its cores, clocks and vector units,
// and a rank's share of them, vary by machine), so its row is measured when wanted
// (device_probe), as is any backend's on request (`titan --estimate --device-table probe`,
// which prints the row to keep for a GPU).
#pragma once

#include <stdbool.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// The GEMM operand precisions a step runs: fp32, bf16 (mixed precision), float8 (e4m3/e5m2
// operands of float8 Linears).
typedef enum { GEMM_FP32, GEMM_BF16, GEMM_FLOAT8, GEMM_PRECISIONS } GemmPrecision;

// The backend GEMMs' precision under a compute dtype (MixedPrecisionPolicy.param).
static inline GemmPrecision gemm_precision_of(Dtype compute) {
    return compute == DTYPE_BF16 ? GEMM_BF16 : GEMM_FP32;
}

typedef struct {
    const char *name;    // "H100 SXM"; a probed row: the backend's describe() first part
    const char *source;  // where the numbers came from, with the date
    // Dense GEMM FLOP/s by operand precision. peak: MFU's denominator, a GPU's data sheet's (0
    // for fp32, off the tensor cores), a probed cpu's measured GEMM peak; gemm: what a step's
    // GEMMs reach (0: not run, as float8 on a GPU without it, which falls back to bf16's).
    double peak[GEMM_PRECISIONS], gemm[GEMM_PRECISIONS];
    // Attention forward + backward, real FLOP/s at head_dim attention_head_dim: 12 * head_dim
    // FLOPs per query-key pair a query sees (half the square under a causal mask).
    double attention;
    int attention_head_dim;
    double memory;     // bytes/s the elementwise ops (norms, SwiGLU, adds, bf16 casts) move
    double optimizer;  // bytes/s of the optimizer's update (AdamW: 4 floats read, 3 written)
    double cast;       // bytes/s of float8's casts (amax, then quantize: 9 bytes an element)
    double op;      // seconds of issue cost per op (a GPU's launch, a cpu's thread fork-join)
    // Collective bytes/s per device: to a device of the same node (NVLink), and to another
    // node's (the network); devices_per_node of them on a node.
    double link_node, link_network;
    int devices_per_node;
} DeviceTable;

// The kept row named `name` in any case ("H100 SXM", or its marker "H100"), NULL if none; device_table_names writes them all, ", " apart, for an error line.
const DeviceTable *device_table_named(const char *name);
// The kept row of the GPU whose device name (cudaDeviceProp.name, "NVIDIA H100 80GB HBM3")
// contains a row's marker, NULL if none.
const DeviceTable *device_table_for_gpu(const char *device_name);
void device_table_names(char *buf, size_t len);

// What a probe measures at: the compute dtype (bf16 GEMMs and attention under bf16 mixed
// precision), the model's shapes (an FFN-shaped Linear (rows, dim) -> (rows, 3 dim), a decoder
// layer's elementwise ops on (rows, dim), its causal attention at head_dim on up to seq_len
// rows; rows are a microbatch's, each capped at what a probe of about a second can run), and
// whether float8's GEMMs and casts are measured too (a GPU without them would refuse).
typedef struct {
    Dtype compute;
    int rows, dim, head_dim, seq_len;
    bool float8;
} ProbeShape;

// Measures the started backend k (after init) in about `seconds` at the shapes `shape` names;
// peak is k's peak_flops (a GPU's data sheet, a cpu's measured GEMM peak), the network stays 0
// (one process cannot measure it), every rank is on one node (devices_per_node 0) and its
// link is the memory's (ranks on a host move bytes through shared memory).
DeviceTable device_probe(const KernelOps *k, const ProbeShape *shape, double seconds);
// Best FLOP/s of k's (n, n, n) GEMM on operands of dtype ab over `seconds`: cpu's peak_flops.
double device_probe_gemm(const KernelOps *k, Dtype ab, int n, double seconds);

#ifdef __cplusplus
}
#endif
