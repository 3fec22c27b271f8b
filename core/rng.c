#include "core/rng.h"

#include <math.h>

// splitmix64 (Steele, Lea, Flood 2014): a full-period bijective mixer of a 64-bit counter.
static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t rng_key(uint64_t seed, const char *stream_name) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the name, then mixed with the seed
    for (const char *c = stream_name; *c; c++) h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
    return mix64(h ^ mix64(seed));
}

double rng_uniform(uint64_t key, uint64_t index) {
    uint64_t bits = mix64(key ^ mix64(index)) >> 11;  // 53 random bits
    return ((double)bits + 0.5) * 0x1.0p-53;
}

static double normal_cdf(double x) { return 0.5 * erfc(-x / M_SQRT2); }

// Inverse of the standard normal CDF: Acklam's rational approximation (relative error 1e-9)
// polished by one Halley step against erfc, which brings it to double precision.
static double normal_icdf(double p) {
    static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                               -2.759285104469687e+02, 1.383577518672690e+02,
                               -3.066479806614716e+01, 2.506628277459239e+00};
    static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                               -1.556989798598866e+02, 6.680131188771972e+01,
                               -1.328068155288572e+01};
    static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                               -2.400758277161838e+00, -2.549732539343734e+00,
                               4.374664141464968e+00,  2.938163982698783e+00};
    static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                               2.445134137142996e+00, 3.754408661907416e+00};
    double x;
    if (p < 0.02425 || p > 1 - 0.02425) {
        double q = sqrt(-2 * log(p < 0.5 ? p : 1 - p));
        x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
        if (p > 0.5) x = -x;
    } else {
        double q = p - 0.5, r = q * q;
        x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
            (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
    }
    double e = normal_cdf(x) - p;
    double u = e * sqrt(2 * M_PI) * exp(x * x / 2);
    return x - u / (1 + x * u / 2);
}

void rng_fill_trunc_normal(float *x, size_t count, uint64_t key, uint64_t first, double mean,
                           double std, double lo, double hi) {
    double cdf_lo = isinf(lo) ? 0.0 : normal_cdf((lo - mean) / std);
    double cdf_hi = isinf(hi) ? 1.0 : normal_cdf((hi - mean) / std);
    // Each value depends on its index alone, so threads give the same values; a 1B model's
    // 1.2e9 draws (~100 ns each) take minutes on one thread.
#pragma omp parallel for schedule(static) if (count >= 65536)
    for (size_t j = 0; j < count; j++) {
        double p = cdf_lo + (cdf_hi - cdf_lo) * rng_uniform(key, first + j);
        double v = mean + std * normal_icdf(p);
        x[j] = (float)fmin(fmax(v, lo), hi);
    }
}
