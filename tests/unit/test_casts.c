// core/float8.h and core/bf16.h: the host number formats' own properties. Every code decodes
// and casts back to itself (NaN to the NaN of its sign); a cast picks the nearest code, ties to
// the even one, against a search over all codes; overflow saturates or gives NaN / infinity as
// asked; signed zeros and subnormals; torchao's amax-to-scale. tests/integration/test_casts.sh
// compares the same casts with ml_dtypes bit for bit.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <float.h>
#include <math.h>

#include "core/bf16.h"
#include "core/float8.h"
#include "core/rng.h"

static const Float8Kind KINDS[] = {FLOAT8_E4M3FN, FLOAT8_E5M2};

static uint32_t bits_of(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static float float_of(uint32_t b) {
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

// The code nearest to x by a search over every finite magnitude and the first one past max
// (standing for overflow, at max + one ulp), ties to the even code: the definition of
// round-to-nearest-even, independent of float8_from_float's bit arithmetic.
static uint8_t nearest_code(float x, Float8Kind kind, bool saturate) {
    Float8Format f = float8_format(kind);
    // Past twice max every value overflows; capped there, the errors below are exact.
    double a = fmin(fabs((double)x), 2.0 * float8_max(kind)), best_err = INFINITY;
    uint32_t best = 0;
    double past_max = 2.0 * float8_max(kind) - float8_to_float((uint8_t)(f.max_code - 1), kind);
    for (uint32_t c = 0; c <= f.max_code + 1; c++) {
        double v = c <= f.max_code ? float8_to_float((uint8_t)c, kind) : past_max;
        double err = fabs(a - v);
        if (err < best_err || (err == best_err && (c & 1) == 0)) best = c, best_err = err;
    }
    if (best > f.max_code)
        best = saturate ? f.max_code : f.has_inf ? f.max_code + 1 : f.nan_code;
    return (uint8_t)((signbit(x) ? 0x80 : 0) | best);
}

static void expect_cast(float x, Float8Kind kind, bool saturate, uint8_t want) {
    uint8_t got = float8_from_float(x, kind, saturate);
    if (got != want)
        fail_msg("%s%s(%a = 0x%08x) = 0x%02x, want 0x%02x",
                 kind == FLOAT8_E4M3FN ? "e4m3fn" : "e5m2", saturate ? " saturating" : "",
                 (double)x, bits_of(x), got, want);
}

// Decoding each of the 256 codes and casting it back gives the code in both modes, except NaN
// (the NaN of its sign) and e5m2's infinities (max when saturating); the finite values grow
// strictly from +0 to max, and the landmarks are those of the OCP FP8 spec.
static void test_every_code_round_trips(void **state) {
    (void)state;
    for (int k = 0; k < 2; k++) {
        Float8Format f = float8_format(KINDS[k]);
        for (uint32_t c = 0; c < 256; c++) {
            uint32_t mag = c & 0x7f, sign = c & 0x80;
            float x = float8_to_float((uint8_t)c, KINDS[k]);
            assert_int_equal(signbit(x) != 0, sign != 0);
            bool nan = mag > f.max_code && !(f.has_inf && mag == f.max_code + 1);
            assert_int_equal(isnan(x), nan);
            uint32_t back = nan ? sign | f.nan_code : c;
            uint32_t saturated = !nan && mag > f.max_code ? sign | f.max_code : back;
            expect_cast(x, KINDS[k], false, (uint8_t)back);
            expect_cast(x, KINDS[k], true, (uint8_t)saturated);
            if (mag > 0 && mag <= f.max_code) {
                float below = float8_to_float((uint8_t)(c - 1), KINDS[k]);
                assert_true(sign ? x < below : x > below);
            }
        }
    }
    assert_true(float8_max(FLOAT8_E4M3FN) == 448.0f && float8_max(FLOAT8_E5M2) == 57344.0f);
    assert_true(float8_to_float(0x01, FLOAT8_E4M3FN) == ldexpf(1, -9));
    assert_true(float8_to_float(0x08, FLOAT8_E4M3FN) == ldexpf(1, -6));
    assert_true(float8_to_float(0x01, FLOAT8_E5M2) == ldexpf(1, -16));
    assert_true(float8_to_float(0x04, FLOAT8_E5M2) == ldexpf(1, -14));
    assert_true(float8_to_float(0x7c, FLOAT8_E5M2) == INFINITY);
    assert_true(float8_to_float(0xfc, FLOAT8_E5M2) == -INFINITY);
}

// Between every two neighbouring codes (subnormal and normal, and from max to overflow): the
// midpoint goes to the even code, one float either side of it to the nearer code; a float
// either side of each code goes to that code.
static void test_ties_go_to_even(void **state) {
    (void)state;
    for (int k = 0; k < 2; k++) {
        Float8Format f = float8_format(KINDS[k]);
        for (uint32_t c = 0; c <= f.max_code; c++) {
            float lo = float8_to_float((uint8_t)c, KINDS[k]);
            float hi = c < f.max_code ? float8_to_float((uint8_t)(c + 1), KINDS[k])
                                      : 2 * lo - float8_to_float((uint8_t)(c - 1), KINDS[k]);
            float mid = lo + (hi - lo) / 2;  // exact: 4 more bits than the codes' at most
            for (int s = 0; s < 2; s++) {
                float sg = s ? -1.0f : 1.0f;
                const float probes[] = {lo, nextafterf(lo, 0), nextafterf(lo, INFINITY),
                                        nextafterf(mid, 0), mid, nextafterf(mid, INFINITY)};
                for (int p = 0; p < 6; p++)
                    for (int sat = 0; sat < 2; sat++)
                        expect_cast(sg * probes[p], KINDS[k], sat,
                                    nearest_code(sg * probes[p], KINDS[k], sat));
            }
            uint32_t even = c & 1 ? c + 1 : c;
            if (even <= f.max_code) expect_cast(mid, KINDS[k], false, (uint8_t)even);
        }
    }
    expect_cast(464.0f, FLOAT8_E4M3FN, false, 0x7e);  // 448 and (no) 480: 448's code is even
    expect_cast(61440.0f, FLOAT8_E5M2, true, 0x7b);
    expect_cast(61440.0f, FLOAT8_E5M2, false, 0x7c);  // 57344's code is odd: infinity
}

// Beyond max: saturating gives +-max, infinities included (torchao clamps before its cast);
// otherwise e4m3fn gives NaN and e5m2 infinity. Just below the rounding boundary stays max.
static void test_overflow(void **state) {
    (void)state;
    const float e4m3_over[] = {nextafterf(464, INFINITY), 480, 1e6f, FLT_MAX, INFINITY};
    const float e5m2_over[] = {61440, 65504, 1e10f, FLT_MAX, INFINITY};
    for (int i = 0; i < 5; i++)
        for (int neg = 0; neg < 2; neg++) {
            uint8_t s = neg ? 0x80 : 0;
            float sg = neg ? -1.0f : 1.0f;
            expect_cast(sg * e4m3_over[i], FLOAT8_E4M3FN, true, s | 0x7e);
            expect_cast(sg * e4m3_over[i], FLOAT8_E4M3FN, false, s | 0x7f);
            expect_cast(sg * e5m2_over[i], FLOAT8_E5M2, true, s | 0x7b);
            expect_cast(sg * e5m2_over[i], FLOAT8_E5M2, false, s | 0x7c);
        }
    expect_cast(nextafterf(61440, 0), FLOAT8_E5M2, false, 0x7b);
    expect_cast(-nextafterf(464, 0), FLOAT8_E4M3FN, false, 0xfe);
}

// NaN of either sign and any payload gives ml_dtypes' NaN of that sign; +-0 and whatever
// rounds to zero (below half the smallest subnormal, every fp32 subnormal) keep their sign;
// the subnormal codes are exact multiples of the smallest.
static void test_nan_zero_subnormals(void **state) {
    (void)state;
    const uint32_t nans[] = {0x7fc00000, 0x7f800001, 0x7fffffff, 0x7fa00000};
    for (int i = 0; i < 4; i++)
        for (int sat = 0; sat < 2; sat++) {
            expect_cast(float_of(nans[i]), FLOAT8_E4M3FN, sat, 0x7f);
            expect_cast(float_of(nans[i] | 0x80000000u), FLOAT8_E4M3FN, sat, 0xff);
            expect_cast(float_of(nans[i]), FLOAT8_E5M2, sat, 0x7e);
            expect_cast(float_of(nans[i] | 0x80000000u), FLOAT8_E5M2, sat, 0xfe);
        }
    for (int k = 0; k < 2; k++) {
        Float8Format f = float8_format(KINDS[k]);
        float tiny = float8_to_float(1, KINDS[k]);
        const float zeros[] = {0.0f, tiny / 2, ldexpf(tiny, -3), FLT_MIN, FLT_TRUE_MIN};
        for (int i = 0; i < 5; i++) {
            expect_cast(zeros[i], KINDS[k], false, 0x00);
            expect_cast(-zeros[i], KINDS[k], true, 0x80);
        }
        expect_cast(nextafterf(tiny / 2, 1), KINDS[k], false, 0x01);
        assert_int_equal(bits_of(float8_to_float(0x80, KINDS[k])), 0x80000000u);
        for (uint32_t m = 1; m < (1u << f.man_bits); m++) {
            expect_cast(tiny * (float)m, KINDS[k], false, (uint8_t)m);
            expect_cast(-tiny * (float)m, KINDS[k], true, (uint8_t)(0x80 | m));
        }
    }
}

// A quarter million random fp32 bit patterns (every class: NaN, infinities, subnormals, far out
// of range) cast as the search over codes says.
static void test_random_floats_match_search(void **state) {
    (void)state;
    uint64_t key = rng_key(14, "test_casts");
    for (uint32_t i = 0; i < 250000; i++) {
        uint32_t bits = (uint32_t)(rng_uniform(key, i) * 4294967296.0);
        // Half of them within 2^-30 .. 2^18, where the formats' subnormals, normals and
        // overflow are.
        if (i & 1) bits = (bits & 0x807fffffu) | (97 + i / 2 % 48) << 23;
        float x = float_of(bits);
        for (int k = 0; k < 2; k++)
            for (int sat = 0; sat < 2; sat++) {
                Float8Format f = float8_format(KINDS[k]);
                uint8_t want = isnan(x) ? (uint8_t)((signbit(x) ? 0x80 : 0) | f.nan_code)
                                        : nearest_code(x, KINDS[k], sat);
                expect_cast(x, KINDS[k], sat, want);
            }
    }
}

// torchao's amax_to_scale: max / max(amax, 1e-12) in double, once rounded to float.
static void test_scale_from_amax(void **state) {
    (void)state;
    assert_true(float8_scale_from_amax(448.0f, FLOAT8_E4M3FN) == 1.0f);
    assert_true(float8_scale_from_amax(2.0f, FLOAT8_E5M2) == 28672.0f);
    assert_true(float8_scale_from_amax(0.0f, FLOAT8_E4M3FN) == (float)(448.0 / 1e-12));
    assert_true(float8_scale_from_amax(1e-13f, FLOAT8_E5M2) == (float)(57344.0 / 1e-12));
    assert_true(float8_scale_from_amax(3.0f, FLOAT8_E4M3FN) == (float)(448.0 / 3.0));
    assert_true(float8_scale_from_amax(INFINITY, FLOAT8_E4M3FN) == 0.0f);
    assert_true(isnan(float8_scale_from_amax(NAN, FLOAT8_E5M2)));
    // Rounded once: 448 / 3e-5 in float division would round twice (3e-5 itself first).
    float amax = 3e-5f;
    assert_true(float8_scale_from_amax(amax, FLOAT8_E4M3FN) == (float)(448.0 / (double)amax));
}

// bf16: every one of the 65536 codes casts back to itself (NaN to the NaN of its sign), and
// between neighbouring finite codes the midpoint goes to the even one.
static void test_bf16_codes(void **state) {
    (void)state;
    for (uint32_t c = 0; c < 0x10000; c++) {
        float x = bf16_to_float((uint16_t)c);
        uint16_t want = isnan(x) ? (uint16_t)((c & 0x8000) | 0x7fc0) : (uint16_t)c;
        assert_int_equal(bf16_from_float(x), want);
        if ((c & 0x7fff) >= 0x7f80) continue;
        uint32_t mid = (c << 16) | 0x8000;  // halfway to the next code up in magnitude
        assert_int_equal(bf16_from_float(float_of(mid)), c & 1 ? c + 1 : c);
        assert_int_equal(bf16_from_float(float_of(mid - 1)), c);
        assert_int_equal(bf16_from_float(float_of(mid + 1)), c + 1);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_code_round_trips),
        cmocka_unit_test(test_ties_go_to_even),
        cmocka_unit_test(test_overflow),
        cmocka_unit_test(test_nan_zero_subnormals),
        cmocka_unit_test(test_random_floats_match_search),
        cmocka_unit_test(test_scale_from_amax),
        cmocka_unit_test(test_bf16_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
