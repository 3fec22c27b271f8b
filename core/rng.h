// Counter-based random numbers: element i of a stream is a pure function of (key, i).
//
// A parameter's initial values therefore depend only on the seed, the parameter's name and the
// element's global index, never on the order of initialisation or on which rank holds which
// shard: an FSDP or TP rank fills exactly the elements it owns and gets the 1-rank values.
#pragma once

#include <stddef.h>
#include <stdint.h>

uint64_t rng_key(uint64_t seed, const char *stream_name);
double rng_uniform(uint64_t key, uint64_t index);  // in the open interval (0, 1)

// x[j] = sample (first + j) of N(mean, std^2) truncated to [lo, hi], drawn by inverting the
// CDF (the method of torch.nn.init.trunc_normal_). lo = -INFINITY, hi = INFINITY: plain normal.
void rng_fill_trunc_normal(float *x, size_t count, uint64_t key, uint64_t first, double mean,
                           double std, double lo, double hi);
