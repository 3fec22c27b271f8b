#include "checkpoint/fletcher32.h"

// HDF5 folds the sums every 360 words, before either can overflow 32 bits; folding is what
// makes the result independent of where the folds fall, but matching its order keeps the
// code obviously the same algorithm.
uint32_t h5_fletcher32(const void *data, size_t bytes) {
    const uint8_t *p = data;
    uint32_t sum1 = 0, sum2 = 0;
    for (size_t words = bytes / 2; words;) {
        size_t n = words > 360 ? 360 : words;
        words -= n;
        for (size_t i = 0; i < n; i++, p += 2) {
            sum1 += (uint32_t)p[0] << 8 | p[1];
            sum2 += sum1;
        }
        sum1 = (sum1 & 0xffff) + (sum1 >> 16);
        sum2 = (sum2 & 0xffff) + (sum2 >> 16);
    }
    if (bytes % 2) {
        sum1 += (uint32_t)p[0] << 8;
        sum2 += sum1;
        sum1 = (sum1 & 0xffff) + (sum1 >> 16);
        sum2 = (sum2 & 0xffff) + (sum2 >> 16);
    }
    sum1 = (sum1 & 0xffff) + (sum1 >> 16);
    sum2 = (sum2 & 0xffff) + (sum2 >> 16);
    return sum2 << 16 | sum1;
}

void h5_fletcher32_append(uint8_t *chunk, size_t bytes) {
    uint32_t sum = h5_fletcher32(chunk, bytes);
    for (int i = 0; i < 4; i++) chunk[bytes + i] = (uint8_t)(sum >> (8 * i));
}
