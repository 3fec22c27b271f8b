// HDF5's Fletcher32 checksum (its H5Z_FILTER_FLETCHER32 filter): what the checkpoint writer
// appends to each chunk it writes itself, so that HDF5 verifies the chunk on every read exactly
// as if its own filter had written it.
#pragma once

#include <stddef.h>
#include <stdint.h>

// The checksum of bytes: 16-bit words read big-endian (a last odd byte as the high half of
// one), summed into two 16-bit Fletcher sums folded every 360 words; sum2 << 16 | sum1.
uint32_t h5_fletcher32(const void *data, size_t bytes);

// A filtered chunk as HDF5 stores it: its bytes, then their checksum, little-endian. chunk
// holds bytes + 4.
void h5_fletcher32_append(uint8_t *chunk, size_t bytes);
