#include "checkpoint/train_state.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "core/nf4.h"

enum { MODEL, EXP_AVG, EXP_AVG_SQ, EMA, OUTER_WEIGHTS, OUTER_MOMENTUM, OUTER_DELTA, N_KINDS };
static const char *const GROUP[N_KINDS] = {"/model/", "/optimizer/exp_avg/",
                                           "/optimizer/exp_avg_sq/", "/ema/",
                                           "/semi_sync/outer_weights/",
                                           "/semi_sync/outer_momentum/", "/semi_sync/delta/"};
// Semi-synchronous training: the replica groups' own state (the kinds before OUTER_WEIGHTS)
// of group r > 0 under /semi_sync/replica_<r>/..., group 0's under the usual names (what a
// model-only reader takes).
#define REPLICA_PREFIX "/semi_sync/replica_"
#define REPLICAS_ATTR "semi_sync.replicas"

// QLoRA's NF4 weights (Param.nf4) are saved as their blobs, /nf4/<fqn>: a 1-D float32 dataset
// of nf4_bytes(numel) / 4 words whose bytes are core/nf4.h's blob of the whole tensor (the
// words are never computed with: HDF5 moves float32 to float32 as it is), so a resume takes
// the very codes it trained with; a reader of whole fp32 tensors (generate, export) takes them
// dequantized.
#define NF4_GROUP_PATH "/nf4/"

// One CkptTensor per parameter and kind that has it: its global shape and this rank's shard box.
typedef struct {
    CkptTensor *tensors;
    int *param;  // each tensor's parameter
    char (*names)[PARAM_NAME_MAX + 64];
    ParamBox *boxes;  // (params->count) shared by the kinds; an NF4 one's its blob's words
    int64_t *nf4_words;  // (params->count) an NF4 parameter's blob's global shape
    bool nf4_listed;     // the blobs are in: one per weight, whatever the replica groups
    int count, capacity;
} TensorList;

static int64_t nf4_words(const Param *p) {
    return (int64_t)(nf4_bytes(param_global_numel(p)) / sizeof(float));
}

// Words [first, first + count) of a blob, a 1-D box.
static ParamBox word_range(int64_t first, int64_t count) {
    return (ParamBox){.ndim = 1, .count = {count},
                      .ranges = {{.n = count > 0, .start = {first}, .count = {count}}}};
}

// The words of an NF4 parameter's blob this rank stores (core/param.h: all of them, its FSDP
// chunk, or none off its pipeline stage).
static ParamBox nf4_box(const Param *p) {
    return word_range((int64_t)((size_t)p->nf4_shard_rank * p->nf4_shard_bytes / 4),
                      (int64_t)(param_nf4_held(p) / 4));
}

static TensorList tensor_list_new(const ParamTable *params, int capacity) {
    int n = params->count;
    TensorList l = {.tensors = xcalloc((size_t)capacity, sizeof(CkptTensor)),
                    .param = xcalloc((size_t)capacity, sizeof(int)),
                    .names = xcalloc((size_t)capacity, sizeof *l.names),
                    .boxes = xcalloc((size_t)n, sizeof(ParamBox)),
                    .nf4_words = xcalloc((size_t)n, sizeof(int64_t)), .capacity = capacity};
    for (int i = 0; i < n; i++) {
        const Param *p = &params->items[i];
        l.boxes[i] = p->nf4 ? nf4_box(p) : param_box(p, true);
        l.nf4_words[i] = p->nf4 ? nf4_words(p) : 0;
    }
    return l;
}

// Adds kind's tensors of parameters [from, to), its shards at base: laid out like params', but
// AdamW's second moments where opt says (none for Muon's matrices). replica: the replica group
// whose state they are (-1: shared by the groups; > 0: named under REPLICA_PREFIX), which only
// its ranks write.
static void list_add(TensorList *l, const ParamTable *params, int kind, float *base,
                     const AdamW *opt, int from, int to, int replica) {
    for (int i = from; i < to; i++) {
        const Param *p = &params->items[i];
        size_t at = kind == EXP_AVG_SQ ? adamw_second_at(opt, params, i)
                    : kind == EXP_AVG  ? adamw_first_at(opt, params, i)
                                       : p->shard_offset;
        bool nf4 = p->nf4 && kind == MODEL;  // its blob; it has no other kind
        if (at == SIZE_MAX && !nf4) continue;  // a moment it has not (Muon's, a frozen weight's)
        if (nf4 && l->nf4_listed) continue;    // frozen: every replica group's is the same
        // Nor has a frozen weight outer state to keep: it never changes (its average is itself,
        // kept for the readers of /ema, which take every weight from there).
        if (p->frozen && kind >= OUTER_WEIGHTS) continue;
        CHECK(l->count < l->capacity);
        int j = l->count++;
        if (replica > 0 && !nf4)
            snprintf(l->names[j], sizeof l->names[j], REPLICA_PREFIX "%d%s%s", replica,
                     GROUP[kind], p->name);
        else
            snprintf(l->names[j], sizeof l->names[j], "%s%s", nf4 ? NF4_GROUP_PATH : GROUP[kind],
                     p->name);
        bool writes = nf4 ? param_nf4_writes(p)
                      : replica < 0 || !opt || !opt->outer.on
                          ? param_is_primary_replica(p)
                          : replica == opt->outer.replica &&
                                param_is_primary_replica_within(p, opt->outer.group);
        l->param[j] = i;
        l->tensors[j] = (CkptTensor){.path = l->names[j], .ndim = nf4 ? 1 : p->ndim,
                                     .shape = nf4 ? &l->nf4_words[i] : p->global_shape,
                                     .data = nf4 ? (float *)p->nf4_shard : base + at,
                                     .box = &l->boxes[i], .replica = !writes};
    }
    l->nf4_listed |= kind == MODEL;
}

// What a save writes and a load reads: the model's weights; opt's moments when it has them
// and its average with ema, each replica group's of them (replicas: the groups listed, from
// `replica`; 1 without semi-sync); with outer, the outer weights and momentum and the delta in
// flight.
typedef struct {
    bool moments, ema, outer;
    int replica, replicas;
} StateKinds;

static TensorList state_list(const ParamTable *params, const AdamW *opt, StateKinds k) {
    int n = params->count;
    TensorList l = tensor_list_new(params, n * (4 * k.replicas + 3));
    for (int r = k.replica; r < k.replica + k.replicas; r++) {
        int named = opt && opt->outer.on ? r : 0;
        list_add(&l, params, MODEL, params->shard_data, opt, 0, n, named);
        if (k.moments) {
            list_add(&l, params, EXP_AVG, opt->exp_avg, opt, 0, n, named);
            list_add(&l, params, EXP_AVG_SQ, opt->exp_avg_sq, opt, 0, n, named);
        }
        if (k.ema) list_add(&l, params, EMA, opt->ema, opt, 0, n, named);
    }
    if (k.outer) {
        const OuterState *o = &opt->outer;
        list_add(&l, params, OUTER_WEIGHTS, o->weights, opt, 0, n, -1);
        list_add(&l, params, OUTER_MOMENTUM, o->momentum, opt, 0, n, -1);
        list_add(&l, params, OUTER_DELTA, o->delta, opt, o->delta_from, o->delta_to, -1);
    }
    return l;
}

static void tensor_list_free(TensorList *l) {
    free(l->tensors);
    free(l->param);
    free(l->names);
    free(l->boxes);
    free(l->nf4_words);
}

// FSDP's padding after each box: zero, as the optimizer's invariant needs (and an NF4 chunk's,
// which the gather copies as it is).
static void padding_zero(const TensorList *l, const ParamTable *params) {
    for (int j = 0; j < l->count; j++) {
        const Param *p = &params->items[l->param[j]];
        if (p->nf4) {  // the words past the blob's end in FSDP's last chunks
            size_t held = param_nf4_held(p);
            memset(p->nf4_shard + held, 0, p->nf4_shard_bytes - held);
            continue;
        }
        size_t n = box_numel(&l->boxes[l->param[j]]);
        memset(l->tensors[j].data + n, 0, (p->shard_numel - n) * sizeof(float));
    }
}

typedef struct {
    const float *from;
    float *to;
} CopyRun;

static void copy_run(size_t global_first, size_t local_first, size_t count, void *arg) {
    const CopyRun *c = arg;
    memcpy(c->to + local_first, c->from + global_first, count * sizeof(float));
}

// One weight of a file's other form, alone, through a whole fp32 tensor in host memory: an
// NF4 parameter's from a file of fp32 weights (quantized), or an fp32 whole tensor from a
// QLoRA run's blob (dequantized). Collective as ckpt_load: a rank off the weight's pipeline
// stage reads an empty box.
static void load_converted(const char *path, const Param *p, float *data) {
    char name[PARAM_NAME_MAX + 64];
    size_t n = param_global_numel(p);
    ParamBox b = param_box(p, true);  // this rank's shard (empty off its stage)
    bool held = box_numel(&b) > 0;
    if (p->nf4) {  // the whole weight, whatever part of it the rank computes with
        float *x = xmalloc((held ? n : 1) * sizeof(float));
        snprintf(name, sizeof name, "%s%s", GROUP[MODEL], p->name);
        ParamBox whole = {.ndim = p->ndim};
        for (int d = 0; d < p->ndim; d++)
            whole.count[d] = held ? p->global_shape[d] : 0,
            whole.ranges[d] = (ParamRanges){.n = held, .count = {p->global_shape[d]}};
        CkptTensor t = {.path = name, .ndim = p->ndim, .shape = p->global_shape, .data = x,
                        .box = &whole};
        ckpt_load(path, &t, 1);
        if (held) param_nf4_store(p, x);
        free(x);
        return;
    }
    int64_t words = nf4_words(p);
    ParamBox blob_box = word_range(0, held ? words : 0);
    float *blob = xmalloc((size_t)(held ? words : 1) * sizeof(float));
    snprintf(name, sizeof name, "%s%s", NF4_GROUP_PATH, p->name);
    CkptTensor t = {.path = name, .ndim = 1, .shape = &words, .data = blob, .box = &blob_box};
    ckpt_load(path, &t, 1);
    if (held && box_numel(&b) == n) {
        nf4_dequantize(data, (const uint8_t *)blob, n);
    } else if (held) {  // this rank's shard of the whole weight, FSDP's padding zero
        float *whole = xmalloc(n * sizeof(float));
        nf4_dequantize(whole, (const uint8_t *)blob, n);
        CopyRun c = {whole, data};
        param_box_runs(p, &b, copy_run, &c);
        memset(data + box_numel(&b), 0, (p->shard_numel - box_numel(&b)) * sizeof(float));
        free(whole);
    }
    free(blob);
}

// Whether tensor j of l is in the file in its other form: an NF4 weight's blob missing (a file
// of fp32 weights), or an fp32 weight missing where the file has its blob (a QLoRA run's).
static bool stored_other(const char *path, const TensorList *l, int j, const Param *p,
                         bool file_nf4) {
    if (p->nf4) return !file_nf4 || !ckpt_has(path, l->tensors[j].path);
    if (!file_nf4 || ckpt_has(path, l->tensors[j].path)) return false;
    char blob[PARAM_NAME_MAX + 64];
    snprintf(blob, sizeof blob, "%s%s", NF4_GROUP_PATH, p->name);
    return ckpt_has(path, blob);
}

// Loads the listed tensors, those the file holds in their other form converted, one at a time.
static void load_tensors(const char *path, TensorList *l, const ParamTable *params) {
    bool file_nf4 = ckpt_has(path, NF4_GROUP_PATH);
    int kept = 0, n_other = 0, *other = xcalloc((size_t)l->count + 1, sizeof(int));
    float **other_data = xcalloc((size_t)l->count + 1, sizeof(float *));
    for (int j = 0; j < l->count; j++) {
        const Param *p = &params->items[l->param[j]];
        if (stored_other(path, l, j, p, file_nf4)) {
            other[n_other] = l->param[j];
            other_data[n_other++] = l->tensors[j].data;
            continue;
        }
        l->tensors[kept] = l->tensors[j];
        l->param[kept++] = l->param[j];
    }
    l->count = kept;
    ckpt_load(path, l->tensors, l->count);
    padding_zero(l, params);
    for (int k = 0; k < n_other; k++)
        load_converted(path, &params->items[other[k]], other_data[k]);
    free(other);
    free(other_data);
}

bool train_state_try_save(const char *path, const ParamTable *params, const AdamW *opt,
                          TrainProgress progress, uint64_t seed, const char *config_yaml,
                          const CkptAttr *run_attrs, int n_run_attrs, MPI_Comm comm, char *err,
                          size_t errlen) {
    bool outer = opt && opt->outer.on && opt->exp_avg;
    StateKinds kinds = {.moments = opt && opt->exp_avg, .ema = opt && opt->ema, .outer = outer,
                        .replicas = outer ? opt->outer.replicas : 1};
    TensorList list = state_list(params, opt, kinds);
    int n_attrs = 5 + n_run_attrs + outer;
    CkptAttr *attrs = xcalloc((size_t)n_attrs, sizeof(CkptAttr));
    attrs[0] = (CkptAttr){.name = "step", .type = CKPT_INT, .i = progress.step};
    attrs[1] = (CkptAttr){.name = "optimizer_step", .type = CKPT_INT, .i = opt ? opt->step : 0};
    attrs[2] = (CkptAttr){.name = "data_windows_consumed", .type = CKPT_INT,
                          .i = progress.windows_consumed};
    attrs[3] = (CkptAttr){.name = "seed", .type = CKPT_INT, .i = (int64_t)seed};
    attrs[4] = (CkptAttr){.name = "config", .type = CKPT_STRING, .s = config_yaml};
    for (int i = 0; i < n_run_attrs; i++) attrs[5 + i] = run_attrs[i];
    if (outer)
        attrs[5 + n_run_attrs] = (CkptAttr){.name = REPLICAS_ATTR, .type = CKPT_INT,
                                            .i = opt->outer.replicas};
    // A copy's tensor is its original's (Param.copy): written once, under the original.
    int n = 0;
    for (int j = 0; j < list.count; j++)
        if (!params->items[list.param[j]].copy) list.tensors[n++] = list.tensors[j];
    bool ok = ckpt_try_save(path, list.tensors, n, attrs, n_attrs, comm, err, errlen);
    free(attrs);
    tensor_list_free(&list);
    return ok;
}

void train_state_save(const char *path, const ParamTable *params, const AdamW *opt,
                      TrainProgress progress, uint64_t seed, const char *config_yaml,
                      const CkptAttr *run_attrs, int n_run_attrs, MPI_Comm comm) {
    char err[2048];
    if (!train_state_try_save(path, params, opt, progress, seed, config_yaml, run_attrs,
                              n_run_attrs, comm, err, sizeof err))
        ckpt_save_fail(err, comm);
}

bool train_state_has_optimizer(const char *path) { return ckpt_has(path, "/optimizer"); }
bool train_state_has_ema(const char *path) { return ckpt_has(path, "/ema"); }

bool train_state_load(const char *path, ParamTable *params, AdamW *opt, TrainProgress *progress) {
    bool ema = opt && opt->ema && train_state_has_ema(path);
    StateKinds kinds = {.moments = opt != NULL, .ema = ema, .replicas = 1};
    if (opt && opt->outer.on) {
        OuterState *o = &opt->outer;
        int64_t saved = ckpt_has_attr(path, REPLICAS_ATTR) ? ckpt_read_int(path, REPLICAS_ATTR) : 1;
        // Each group its own state when the file has as many; else every group group 0's.
        kinds.replica = saved == o->replicas ? o->replica : 0;
        kinds.outer = o->loaded = ckpt_has(path, "/semi_sync/outer_weights");
        char delta[PARAM_NAME_MAX + 64];
        if (o->delta_from < o->delta_to)
            snprintf(delta, sizeof delta, "%s%s", GROUP[OUTER_DELTA],
                     params->items[o->delta_from].name);
        if (!kinds.outer || (o->delta_from < o->delta_to && !ckpt_has(path, delta)))
            o->delta_from = o->delta_to = 0;  // not in the file: semi_sync_start makes it
    }
    TensorList list = state_list(params, opt, kinds);
    load_tensors(path, &list, params);
    if (opt) opt->step = (int)ckpt_read_int_in(path, "optimizer_step", 0, INT_MAX);
    if (progress) {
        progress->step = ckpt_read_int_in(path, "step", 0, INT_MAX);
        progress->windows_consumed =
            ckpt_read_int_in(path, "data_windows_consumed", 0, TRAIN_STATE_MAX_WINDOWS);
    }
    tensor_list_free(&list);
    return ema;
}

void train_state_load_ema(const char *path, ParamTable *params) {
    if (!train_state_has_ema(path))
        die_user("checkpoint %s holds no average of the weights (/ema): its run had "
                 "training.ema_decay 0 (or it is a seed checkpoint)", path);
    TensorList list = tensor_list_new(params, params->count);
    list_add(&list, params, EMA, params->shard_data, NULL, 0, params->count, -1);
    load_tensors(path, &list, params);
    tensor_list_free(&list);
}
