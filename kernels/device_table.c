// The kept GPU rows of kernels/device.h's table. Peaks are NVIDIA's data sheets (dense, no
// sparsity; SXM parts unless named), as torchtitan's get_peak_flops. The achieved rates are not
// yet titan's own: no GPU has run `titan --estimate --device-table probe` with this table
// (scripts/bench_gpu.sh does, and its row replaces the one here, with its date). Until then
// they are published measurements of the libraries titan calls, named per row: cuBLASLt's
// large-GEMM rate, cuDNN/FlashAttention-3's causal forward + backward at head_dim 128, a STREAM
// copy's bandwidth (for the elementwise ops, the optimizer and float8's casts alike), nccl-tests'
// bus bandwidth. fp32 GEMMs run off the tensor cores: no peak is
// claimed for them (MFU n/a), and their rate is the CUDA cores' FMA peak's three quarters.
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "kernels/device.h"

#define TERA 1e12
#define GIGA 1e9

static const struct {
    const char *marker;  // in cudaDeviceProp.name, longest first among rows it prefixes
    DeviceTable row;
} ROWS[] = {
    {"H100 PCIe",
     {"H100 PCIe", "data sheet peaks; rates published (2024-25), not titan's (2026-12-06)",
      {0, 756 * TERA, 1513 * TERA}, {38 * TERA, 570 * TERA, 1000 * TERA}, 330 * TERA, 128,
      1.8 * TERA, 1.8 * TERA, 1.8 * TERA, 5e-6, 50 * GIGA, 40 * GIGA, 8}},
    {"H100 NVL",
     {"H100 NVL", "data sheet peaks; rates published (2024-25), not titan's (2026-12-06)",
      {0, 835 * TERA, 1671 * TERA}, {45 * TERA, 620 * TERA, 1100 * TERA}, 380 * TERA, 128,
      3.4 * TERA, 3.4 * TERA, 3.4 * TERA, 5e-6, 300 * GIGA, 40 * GIGA, 8}},
    {"H100",
     {"H100 SXM", "data sheet peaks; rates published (2024-25), not titan's (2026-12-06)",
      {0, 989 * TERA, 1979 * TERA}, {50 * TERA, 740 * TERA, 1300 * TERA}, 450 * TERA, 128,
      3.0 * TERA, 3.0 * TERA, 3.0 * TERA, 5e-6, 360 * GIGA, 45 * GIGA, 8}},
    {"H200",
     {"H200 SXM", "data sheet peaks; rates published (2024-25), not titan's (2026-12-06)",
      {0, 989 * TERA, 1979 * TERA}, {50 * TERA, 760 * TERA, 1350 * TERA}, 470 * TERA, 128,
      4.3 * TERA, 4.3 * TERA, 4.3 * TERA, 5e-6, 360 * GIGA, 45 * GIGA, 8}},
    {"B200",
     {"B200", "data sheet peaks; rates published (2025), not titan's (2026-12-06)",
      {0, 2250 * TERA, 4500 * TERA}, {60 * TERA, 1600 * TERA, 3000 * TERA}, 900 * TERA, 128,
      7.0 * TERA, 7.0 * TERA, 7.0 * TERA, 5e-6, 720 * GIGA, 45 * GIGA, 8}},
    {"A100",
     {"A100 SXM", "data sheet peaks; rates published (2022-23), not titan's (2026-12-06)",
      {0, 312 * TERA, 0}, {14 * TERA, 270 * TERA, 0}, 190 * TERA, 128, 1.8 * TERA, 1.8 * TERA, 1.8 * TERA, 5e-6,
      230 * GIGA, 22 * GIGA, 8}},
    {"L40S",
     {"L40S", "data sheet peaks; rates published (2024), not titan's (2026-12-06)",
      {0, 362 * TERA, 733 * TERA}, {68 * TERA, 250 * TERA, 480 * TERA}, 150 * TERA, 128,
      0.8 * TERA, 0.8 * TERA, 0.8 * TERA, 5e-6, 25 * GIGA, 25 * GIGA, 8}},
};
enum { N_ROWS = sizeof ROWS / sizeof ROWS[0] };

// "H100 SXM" or its marker "H100", in any case.
const DeviceTable *device_table_named(const char *name) {
    for (int i = 0; i < N_ROWS; i++)
        if (!strcasecmp(name, ROWS[i].row.name) || !strcasecmp(name, ROWS[i].marker))
            return &ROWS[i].row;
    return NULL;
}

const DeviceTable *device_table_for_gpu(const char *device_name) {
    for (int i = 0; i < N_ROWS; i++)
        if (strstr(device_name, ROWS[i].marker)) return &ROWS[i].row;
    return NULL;
}

void device_table_names(char *buf, size_t len) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < N_ROWS && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", ROWS[i].row.name);
}
