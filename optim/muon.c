// Muon (Jordan et al. 2024, as torch.optim.Muon): each of its matrices' update is the momentum
// of the gradient, orthogonalized by a Newton-Schulz iteration, scaled by the matrix shape.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdio.h>

#include "core/errors.h"
#include "optim/optim.h"

// torch.optim.Muon's quintic coefficients (Keller Jordan's, tuned for 5 steps) and the floor of
// the norm the update is divided by.
static const double NS_A = 3.4445, NS_B = -4.7750, NS_C = 2.0315, NS_EPS = 1e-7;

// A parameter's matrices: E (1, or a stacked expert weight's experts) of rows x cols.
typedef struct {
    int count, rows, cols;
} Matrices;

static Matrices matrices_of(const Param *p) {
    int d = p->ndim;
    return (Matrices){.count = d == 3 ? (int)p->global_shape[0] : 1,
                      .rows = (int)p->global_shape[d - 2], .cols = (int)p->global_shape[d - 1]};
}

bool muon_select(Muon *m, const ParamTable *params, const char *pattern, const char *origin,
                 char *err, size_t errlen) {
    int code;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, 0, &code, &at,
                                   NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        snprintf(err, errlen, "%s: optimizer.muon_pattern is not a regular expression: %s at "
                 "offset %zu", origin, (const char *)msg, (size_t)at);
        return false;
    }
    pcre2_match_data *match = pcre2_match_data_create_from_pattern(re, NULL);
    m->is_muon = xcalloc((size_t)params->count, sizeof(bool));
    int chosen = 0;
    bool ok = true;
    for (int i = 0; i < params->count && ok; i++) {
        const Param *p = &params->items[i];
        if (p->buffer || p->frozen) continue;  // not trained (a copy goes as its original)
        int rc = pcre2_match(re, (PCRE2_SPTR)p->name, PCRE2_ZERO_TERMINATED, 0, 0, match, NULL);
        if (rc < 0) continue;
        if (p->ndim < 2) {
            snprintf(err, errlen, "%s: optimizer.muon_pattern matches %s, a 1-D parameter: Muon "
                     "orthogonalizes matrices (and stacks of them)", origin, p->name);
            ok = false;
            continue;
        }
        m->is_muon[i] = true;
        chosen++;
        Matrices x = matrices_of(p);  // muon_update's scratch for it, at most
        size_t s = (size_t)(x.rows < x.cols ? x.rows : x.cols);
        size_t need = 2 * param_global_numel(p) + (size_t)x.rows * x.cols + 2 * s * s;
        if (need > m->scratch_floats) m->scratch_floats = need;
    }
    if (ok && chosen == 0) {
        snprintf(err, errlen, "%s: optimizer.muon_pattern matches no parameter of this model: "
                 "Muon would update nothing", origin);
        ok = false;
    }
    pcre2_match_data_free(match);
    pcre2_code_free(re);
    return ok;
}

void muon_allocate(Muon *m, Arena *state) {
    m->scratch = arena_floats(state, m->scratch_floats);
    if (m->shards) m->shards->buffer = arena_floats(state, m->shards->floats);
}

double muon_flops(const Muon *m, const Param *p, size_t n) {
    Matrices x = matrices_of(p);
    double s = x.rows < x.cols ? x.rows : x.cols, l = x.rows < x.cols ? x.cols : x.rows;
    return (double)n / ((double)x.rows * x.cols) * m->ns_steps * (4 * s * s * l + 2 * s * s * s);
}

// torch.optim.Muon's _adjust_lr for a (rows, cols) matrix.
static double adjusted_lr(const Muon *m, double lr, Matrices x) {
    double a = x.rows, b = x.cols;
    return m->match_rms_adamw ? lr * 0.2 * sqrt(fmax(a, b)) : lr * sqrt(fmax(1.0, a / b));
}

// x (rows, cols) = its orthogonalization: ns_steps of X = a X + (b A + c A^2) X, A = X X^T,
// on x / ||x||_F, the Gram matrix on the shorter side (tall: X = a X + X (b A + c A^2),
// A = X^T X, the same iteration transposed). y: (rows, cols), gram and poly: (s, s) scratch.
static void orthogonalize(const Muon *m, const KernelOps *k, float *x, int rows, int cols,
                          float *y, float *gram, float *poly) {
    size_t n = (size_t)rows * cols;
    double norm = sqrt(k->sum_squares(x, n));
    k->scale(x, n, (float)(1.0 / fmax(norm, NS_EPS)));
    bool wide = rows <= cols;
    int s = wide ? rows : cols, inner = wide ? cols : rows;
    size_t ss = (size_t)s * s * sizeof(float);
    for (int step = 0; step < m->ns_steps; step++) {
        k->matmul(gram, x, x, DTYPE_FP32, s, s, inner, !wide, wide, 0);
        k->copy(poly, gram, ss);  // b A + c A^2 = c (A A + (b / c) A)
        k->matmul(poly, gram, gram, DTYPE_FP32, s, s, s, false, false, (float)(NS_B / NS_C));
        k->scale(poly, (size_t)s * s, (float)NS_C);
        k->copy(y, x, n * sizeof(float));
        if (wide)
            k->matmul(y, poly, x, DTYPE_FP32, rows, cols, rows, false, false, (float)NS_A);
        else
            k->matmul(y, x, poly, DTYPE_FP32, rows, cols, cols, false, false, (float)NS_A);
        float *t = x;  // x <- y: the result lands in the caller's buffer after an even count
        x = y, y = t;
    }
    if (m->ns_steps % 2) k->copy(y, x, n * sizeof(float));
}

void muon_update(const Muon *m, const KernelOps *k, const Param *p, int ordinal, float *weight,
                 const float *grad, float *momentum, double lr, double weight_decay) {
    Matrices x = matrices_of(p);
    size_t n = p->shard_numel, all = param_global_numel(p), each = (size_t)x.rows * x.cols;
    size_t s = (size_t)(x.rows < x.cols ? x.rows : x.cols);
    float *whole = m->scratch, *update = whole + all, *y = update + n, *gram = y + each;
    float *poly = gram + s * s;
    CHECK(poly + s * s <= m->scratch + m->scratch_floats);
    float beta = (float)m->momentum;
    // momentum = beta momentum + (1 - beta) grad; the update: (1 - beta) grad + beta momentum
    // with Nesterov, else the momentum (on the shard: each element on its own)
    k->copy(update, grad, n * sizeof(float));
    k->scale(update, n, 1 - beta);
    k->scale(momentum, n, beta);
    k->add(momentum, update, n);
    if (m->nesterov) {
        k->copy(whole, momentum, n * sizeof(float));  // (whole is scratch until gathered)
        k->scale(whole, n, beta);
        k->add(update, whole, n);
    } else {
        k->copy(update, momentum, n * sizeof(float));
    }
    // orthogonalized matrix by matrix, whole, by one rank
    float *u = m->shards ? m->shards->gather(m->shards, p, ordinal, update, whole) : update;
    size_t held = u == update ? n : all;
    CHECK(!u || held % each == 0);
    for (size_t first = 0; u && first < held; first += each)
        orthogonalize(m, k, u + first, x.rows, x.cols, y, gram, poly);
    if (m->shards) m->shards->scatter(m->shards, p, ordinal, whole, update);
    k->scale(weight, n, (float)(1 - lr * weight_decay));
    k->scale(update, n, (float)-adjusted_lr(m, lr, x));
    k->add(weight, update, n);
}
