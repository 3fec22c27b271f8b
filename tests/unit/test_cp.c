// Context parallel's attention (MPI; also a plain unit test on 1 rank): the sequence split over
// every rank of the job in the head-tail layout, both rotate methods, causal and document
// masks, against the kernel on the whole sequences. Each rank's out and lse must equal the
// whole run's rows at its positions, and its dq, dk, dv the whole run's gradients there
// (dk, dv summed over every rank's queries), within 1e-5 of the largest reference value. The
// ring is the mesh's (cp over every rank): its cp_prev and cp_next, which at cp 2 are one rank
// and only from cp 4 on tell the direction apart.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/cp/cp.h"
#include "parallel/cp/layout.h"
#include "parallel/mesh.h"

enum { B = 2, H = 4, KV = 2, HD = 8 };

static Mesh mesh;  // cp over every rank

typedef struct {
    float *q, *k, *v, *dout;  // (B, T, heads, HD) inputs
    float *out, *lse;         // (B, T, H, HD), (B, H, T)
    float *dq, *dk, *dv;
} Tensors;

static float *floats(size_t n) { return calloc(n, sizeof(float)); }

static void tensors_alloc(Tensors *t, int T) {
    size_t nq = (size_t)B * T * H * HD, nkv = (size_t)B * T * KV * HD;
    *t = (Tensors){floats(nq), floats(nkv), floats(nkv), floats(nq), floats(nq),
                   floats((size_t)B * H * T), floats(nq), floats(nkv), floats(nkv)};
}

static void tensors_free(Tensors *t) {
    float *all[] = {t->q, t->k, t->v, t->dout, t->out, t->lse, t->dq, t->dk, t->dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

// The same values on every rank: a hash of the index.
static void fill(float *x, size_t n, unsigned salt) {
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((((i + 1) * 2654435761u + salt * 40503u) >> 8) % 2001) / 1000.0f - 1.0f;
}

// x_local (B, Tl, width) = the columns pos of x (B, T, width).
static void select_rows(float *local, const float *x, int T, const int *pos, int Tl, int width) {
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Tl; i++)
            memcpy(local + ((size_t)b * Tl + i) * width, x + ((size_t)b * T + pos[i]) * width,
                   width * sizeof(float));
}

// The same for lse (B, H, T).
static void select_lse(float *local, const float *lse, int T, const int *pos, int Tl) {
    for (int r = 0; r < B * H; r++)
        for (int i = 0; i < Tl; i++) local[(size_t)r * Tl + i] = lse[(size_t)r * T + pos[i]];
}

static void assert_close(const float *got, const float *want, size_t n, const char *what) {
    double err = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(want[i]) && got[i] == want[i]) continue;
        err = fmax(err, fabs((double)got[i] - want[i]));
        scale = fmax(scale, fabs((double)want[i]));
    }
    if (err > 1e-5 * scale) fail_msg("%s: off by %g (scale %g)", what, err, scale);
}

static void check(CpRotate rotate, AttnMask mask) {
    const KernelOps *k = kernels_backend("cpu");
    CommGroup *group = mesh.group[MESH_CP];
    int cp = comm_size(group), rank = comm_rank(group), T = 8 * cp, Tl = T / cp;
    // Documents of 5 tokens (the last one shorter): boundaries fall inside chunks.
    int *doc = malloc((size_t)B * T * sizeof(int)), *pos = malloc((size_t)Tl * sizeof(int));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) doc[b * T + t] = (t + 2 * b) / 5;
    cp_positions(T, cp, rank, pos);

    Tensors whole, local;
    tensors_alloc(&whole, T);
    tensors_alloc(&local, Tl);
    size_t nq = (size_t)B * T * H * HD, nkv = (size_t)B * T * KV * HD;
    fill(whole.q, nq, 1), fill(whole.k, nkv, 2), fill(whole.v, nkv, 3), fill(whole.dout, nq, 4);
    AttnShape full = {.B = B, .Tq = T, .Tk = T, .n_heads = H, .n_kv_heads = KV, .head_dim = HD,
                      .mask = mask, .q_doc = mask == ATTN_DOCUMENT ? doc : NULL,
                      .kv_doc = mask == ATTN_DOCUMENT ? doc : NULL};
    void *ws = malloc(k->attention_workspace_bytes(&full));
    k->attention_forward(whole.out, whole.lse, whole.q, whole.k, whole.v, &full, ws);
    k->attention_backward(whole.dq, whole.dk, whole.dv, whole.dout, whole.q, whole.k, whole.v,
                          whole.out, whole.lse, &full, ws);
    free(ws);

    select_rows(local.q, whole.q, T, pos, Tl, H * HD);
    select_rows(local.k, whole.k, T, pos, Tl, KV * HD);
    select_rows(local.v, whole.v, T, pos, Tl, KV * HD);
    select_rows(local.dout, whole.dout, T, pos, Tl, H * HD);
    Cp c;
    cp_init(&c, group, mesh.cp_prev, mesh.cp_next, rotate);
    StepCtx s = {.k = k, .B = B, .T = Tl};
    // The hooks get the whole sequences' document ids as the keys' (protocols/block.h).
    AttnShape shape = {.B = B, .Tq = Tl, .Tk = Tl, .n_heads = H, .n_kv_heads = KV,
                       .head_dim = HD, .mask = mask,
                       .kv_doc = mask == ATTN_DOCUMENT ? doc : NULL};
    ws = malloc(c.hooks.workspace_bytes(&c.hooks, &s, &shape));
    c.hooks.forward(&c.hooks, &s, local.out, local.lse, local.q, local.k, local.v, &shape, ws);
    c.hooks.backward(&c.hooks, &s, local.dq, local.dk, local.dv, local.dout, local.q, local.k,
                     local.v, local.out, local.lse, &shape, ws);
    free(ws);

    Tensors want;
    tensors_alloc(&want, Tl);
    select_rows(want.out, whole.out, T, pos, Tl, H * HD);
    select_lse(want.lse, whole.lse, T, pos, Tl);
    select_rows(want.dq, whole.dq, T, pos, Tl, H * HD);
    select_rows(want.dk, whole.dk, T, pos, Tl, KV * HD);
    select_rows(want.dv, whole.dv, T, pos, Tl, KV * HD);
    size_t lq = (size_t)B * Tl * H * HD, lkv = (size_t)B * Tl * KV * HD;
    assert_close(local.out, want.out, lq, "out");
    assert_close(local.lse, want.lse, (size_t)B * H * Tl, "lse");
    assert_close(local.dq, want.dq, lq, "dq");
    assert_close(local.dk, want.dk, lkv, "dk");
    assert_close(local.dv, want.dv, lkv, "dv");
    // Every transfer was counted: K/V forward and backward on each of the ring's cp - 1 hops
    // and dK/dV on all cp of them, or a gather each way and a reduce-scatter.
    int64_t transfers = rotate == CP_ALLTOALL ? 2 * (int64_t)(cp - 1) + cp : 3;
    assert_int_equal(c.transfers, transfers);
    tensors_free(&whole);
    tensors_free(&local);
    tensors_free(&want);
    free(doc);
    free(pos);
}

static void test_allgather_causal(void **state) { (void)state, check(CP_ALLGATHER, ATTN_CAUSAL); }
static void test_alltoall_causal(void **state) { (void)state, check(CP_ALLTOALL, ATTN_CAUSAL); }
static void test_allgather_documents(void **state) {
    (void)state, check(CP_ALLGATHER, ATTN_DOCUMENT);
}
static void test_alltoall_documents(void **state) {
    (void)state, check(CP_ALLTOALL, ATTN_DOCUMENT);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    MeshLayout layout;
    char err[256];
    int n = comm_size(comm_world()), degrees[MESH_NDIMS] = {1, 1, 1, n, 1};
    if (!mesh_plan(&layout, degrees, n, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    mesh_build(&mesh, &layout);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allgather_causal),
        cmocka_unit_test(test_alltoall_causal),
        cmocka_unit_test(test_allgather_documents),
        cmocka_unit_test(test_alltoall_documents),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    comm_finalize();
    return failed;
}
