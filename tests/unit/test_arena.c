// Arenas count their bytes by dtype (core/arena.h): every carve adds its ARENA_ALIGN-rounded
// bytes to its dtype, the peak keeps the split of the moment the total was highest (its parts
// always sum to it), and a release restores the split of its mark, whether the mark is released
// once, again (a reserve loop's pattern), or dropped by a release below it; the committed pass
// carves the same bytes without moving the peak. A release to an offset where no mark is held,
// and more than ARENA_MARKS marks held at once, are titan's bugs (exit 3).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/arena.h"
#include "core/errors.h"

// b's parts, one per dtype in order, and their sum.
static void expect_bytes(ArenaBytes b, size_t fp32, size_t bf16, size_t e4m3, size_t e5m2,
                         size_t int32, size_t bytes) {
    size_t want[DTYPE_COUNT] = {fp32, bf16, e4m3, e5m2, int32, bytes};
    for (int t = 0; t < DTYPE_COUNT; t++) assert_int_equal(b.by[t], want[t]);
    assert_int_equal(b.total, fp32 + bf16 + e4m3 + e5m2 + int32 + bytes);
}

// Each dtype's element size, each carve rounded up to ARENA_ALIGN (64).
static void test_carves_count_by_dtype(void **state) {
    (void)state;
    Arena a;
    arena_init_sizing(&a, "test");
    assert_null(arena_floats(&a, 10));                 // 40 bytes -> 64
    assert_null(arena_tensor(&a, 100, DTYPE_BF16));   // 200 -> 256
    assert_null(arena_tensor(&a, 65, DTYPE_E4M3));    // 65 -> 128
    assert_null(arena_tensor(&a, 64, DTYPE_E5M2));    // 64
    assert_null(arena_tensor(&a, 3, DTYPE_INT32));    // 12 -> 64
    assert_null(arena_alloc(&a, 1));                  // 1 -> 64
    expect_bytes(a.used, 64, 256, 128, 64, 64, 64);
    expect_bytes(a.peak, 64, 256, 128, 64, 64, 64);
}

// The peak is one moment's split, not each dtype's own maximum: a phase of bf16 scratch and a
// smaller later phase of float8 scratch leave the bf16 one's split; a larger float8 phase
// replaces it.
static void test_peak_is_one_moment(void **state) {
    (void)state;
    Arena a;
    arena_init_sizing(&a, "test");
    arena_floats(&a, 16 * 100);  // 6400 bytes kept
    size_t mark = arena_mark(&a);
    assert_int_equal(mark, 6400);
    arena_tensor(&a, 32 * 100, DTYPE_BF16);  // 6400 of scratch
    arena_release(&a, mark);
    expect_bytes(a.used, 6400, 0, 0, 0, 0, 0);
    mark = arena_mark(&a);
    arena_tensor(&a, 64 * 50, DTYPE_E4M3);  // 3200: below the peak
    arena_release(&a, mark);
    expect_bytes(a.peak, 6400, 6400, 0, 0, 0, 0);
    mark = arena_mark(&a);
    arena_tensor(&a, 64 * 150, DTYPE_E4M3);  // 9600: a new peak
    expect_bytes(a.peak, 6400, 0, 9600, 0, 0, 0);
    arena_release(&a, mark);
    expect_bytes(a.used, 6400, 0, 0, 0, 0, 0);
}

// Marks nest: an inner release restores the inner split, the outer one the outer split; an
// inner mark left held is dropped by the outer release; a mark released can be released again
// until a mark is taken; release to 0 empties the arena.
static void test_marks_nest(void **state) {
    (void)state;
    Arena a;
    arena_init_sizing(&a, "test");
    arena_tensor(&a, 16, DTYPE_INT32);  // 64
    size_t outer = arena_mark(&a);
    arena_tensor(&a, 32, DTYPE_BF16);  // 64
    size_t inner = arena_mark(&a);
    arena_floats(&a, 32);  // 128
    arena_release(&a, inner);
    expect_bytes(a.used, 0, 64, 0, 0, 64, 0);
    arena_floats(&a, 16);  // 64
    arena_release(&a, inner);  // again: linear_reserve's pattern
    expect_bytes(a.used, 0, 64, 0, 0, 64, 0);
    arena_mark(&a);  // held, never released
    arena_alloc(&a, 640);
    arena_release(&a, outer);  // drops the mark above it
    expect_bytes(a.used, 0, 0, 0, 0, 64, 0);
    assert_int_equal(a.n_marks, 0);
    arena_tensor(&a, 64, DTYPE_E5M2);
    arena_release(&a, 0);
    expect_bytes(a.used, 0, 0, 0, 0, 0, 0);
    expect_bytes(a.peak, 0, 64, 0, 0, 64, 640);
}

// A loop of balanced phases (each block's scratch) holds one mark at a time, however long.
static void test_balanced_loop_holds_no_marks(void **state) {
    (void)state;
    Arena a;
    arena_init_sizing(&a, "test");
    for (int layer = 0; layer < 10 * ARENA_MARKS; layer++) {
        arena_floats(&a, 16);  // kept: the layer's saved activations
        size_t mark = arena_mark(&a);
        arena_tensor(&a, 32, DTYPE_BF16);
        arena_release(&a, mark);
    }
    assert_int_equal(a.n_marks, 0);
    expect_bytes(a.used, 10 * ARENA_MARKS * 64, 0, 0, 0, 0, 0);
    expect_bytes(a.peak, 10 * ARENA_MARKS * 64, 64, 0, 0, 0, 0);
}

// The committed pass carves the same tensors, aligned and apart, within the committed size,
// and leaves the sizing pass's peak as it was; arena_reserve raises a peak, never lowers it.
static void test_commit_and_reserve(void **state) {
    (void)state;
    Arena a;
    arena_init_sizing(&a, "test");
    arena_reserve(&a, (ArenaBytes){.total = 128, .by[DTYPE_BF16] = 128});
    arena_reserve(&a, (ArenaBytes){.total = 64, .by[DTYPE_FP32] = 64});
    expect_bytes(a.peak, 0, 128, 0, 0, 0, 0);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) arena_commit(&a, NULL);
        float *x = arena_floats(&a, 100);
        size_t mark = arena_mark(&a);
        uint16_t *h = arena_tensor(&a, 100, DTYPE_BF16);
        arena_release(&a, mark);
        int *ids = arena_tensor(&a, 10, DTYPE_INT32);
        if (pass == 0) continue;
        assert_int_equal((uintptr_t)x % ARENA_ALIGN, 0);
        assert_ptr_equal((char *)h, (char *)x + 448);
        assert_ptr_equal((char *)ids, (char *)h);  // the bf16 scratch's bytes, reused
    }
    assert_int_equal(a.size, 448 + 256);
    expect_bytes(a.peak, 448, 256, 0, 0, 0, 0);
    arena_free(&a);
}

static void test_format(void **state) {
    (void)state;
    char out[128];
    ArenaBytes b = {.total = 3 << 20, .by[DTYPE_FP32] = 2 << 20, .by[DTYPE_BF16] = 1 << 20};
    arena_bytes_format(b, 1024.0 * 1024.0, 2, out, sizeof out);
    assert_string_equal(out, "fp32 2.00, bf16 1.00");
    arena_bytes_format(b, 1, 0, out, sizeof out);
    assert_string_equal(out, "fp32 2097152, bf16 1048576");
    arena_bytes_format((ArenaBytes){0}, 1, 0, out, sizeof out);
    assert_string_equal(out, "");
}

// fn dies in a child as titan's bug: exit 3, its message containing want.
static void expect_internal(void (*fn)(void), const char *want) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        fn();
        _exit(0);
    }
    close(fds[1]);
    char out[512] = "";
    ssize_t got, used = 0;
    while ((got = read(fds[0], out + used, sizeof out - 1 - (size_t)used)) > 0) used += got;
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), EXIT_INTERNAL_ERROR);
    assert_non_null(strstr(out, want));
}

// The outer mark is gone once a release below it dropped it: its split is unknown.
static void release_dropped_mark(void) {
    Arena a;
    arena_init_sizing(&a, "stale");
    size_t below = arena_mark(&a);
    arena_floats(&a, 16);
    size_t above = arena_mark(&a);
    arena_release(&a, below);
    arena_floats(&a, 32);
    arena_release(&a, above);
}

static void hold_too_many_marks(void) {
    Arena a;
    arena_init_sizing(&a, "deep");
    for (int i = 0; i <= ARENA_MARKS; i++) {
        arena_floats(&a, 16);
        arena_mark(&a);
    }
}

static void test_misuse_is_internal_error(void **state) {
    (void)state;
    expect_internal(release_dropped_mark, "stale arena: released to 64, where no mark is held");
    expect_internal(hold_too_many_marks, "deep arena: more than 16 marks held");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_carves_count_by_dtype),
        cmocka_unit_test(test_peak_is_one_moment),
        cmocka_unit_test(test_marks_nest),
        cmocka_unit_test(test_balanced_loop_holds_no_marks),
        cmocka_unit_test(test_commit_and_reserve),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_misuse_is_internal_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
