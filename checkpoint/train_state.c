#include "checkpoint/train_state.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"

enum { MODEL, EXP_AVG, EXP_AVG_SQ, EMA, N_KINDS };
static const char *const GROUP[N_KINDS] = {"/model/", "/optimizer/exp_avg/",
                                           "/optimizer/exp_avg_sq/", "/ema/"};

// One CkptTensor per parameter and kind that has it: its global shape and this rank's shard box.
typedef struct {
    CkptTensor *tensors;
    int *param;  // each tensor's parameter
    char (*names)[PARAM_NAME_MAX + 32];
    ParamBox *boxes;  // (params->count) shared by the kinds
    int count;
} TensorList;

// The tensors of the n_kinds kinds listed, each kind's shards at base[k]: laid out like
// params', but AdamW's second moments where opt says (none for Muon's matrices).
static TensorList tensor_list(const ParamTable *params, const int *kinds, float *const *base,
                              int n_kinds, const AdamW *opt) {
    int n = params->count;
    TensorList l = {.tensors = xcalloc((size_t)n * n_kinds, sizeof(CkptTensor)),
                    .param = xcalloc((size_t)n * n_kinds, sizeof(int)),
                    .names = xcalloc((size_t)n * n_kinds, sizeof *l.names),
                    .boxes = xcalloc((size_t)n, sizeof(ParamBox))};
    for (int i = 0; i < n; i++) l.boxes[i] = param_box(&params->items[i], true);
    for (int k = 0; k < n_kinds; k++) {
        for (int i = 0; i < n; i++) {
            const Param *p = &params->items[i];
            size_t at = kinds[k] == EXP_AVG_SQ ? adamw_second_at(opt, params, i) : p->shard_offset;
            if (at == SIZE_MAX) continue;
            int j = l.count++;
            snprintf(l.names[j], sizeof l.names[j], "%s%s", GROUP[kinds[k]], p->name);
            l.param[j] = i;
            l.tensors[j] = (CkptTensor){.path = l.names[j], .ndim = p->ndim,
                                        .shape = p->global_shape, .data = base[k] + at,
                                        .box = &l.boxes[i],
                                        .replica = !param_is_primary_replica(p)};
        }
    }
    return l;
}

// The model's weights, opt's moments when it has them, and with ema its average.
static TensorList state_list(const ParamTable *params, const AdamW *opt, bool ema) {
    int kinds[N_KINDS], n = 0;
    float *base[N_KINDS];
    kinds[n] = MODEL, base[n++] = params->shard_data;
    if (opt && opt->exp_avg) {
        kinds[n] = EXP_AVG, base[n++] = opt->exp_avg;
        kinds[n] = EXP_AVG_SQ, base[n++] = opt->exp_avg_sq;
    }
    if (ema) kinds[n] = EMA, base[n++] = opt->ema;
    return tensor_list(params, kinds, base, n, opt);
}

static void tensor_list_free(TensorList *l) {
    free(l->tensors);
    free(l->param);
    free(l->names);
    free(l->boxes);
}

// FSDP's padding after each box: zero, as the optimizer's invariant needs.
static void padding_zero(const TensorList *l, const ParamTable *params) {
    for (int j = 0; j < l->count; j++) {
        const Param *p = &params->items[l->param[j]];
        size_t n = box_numel(&l->boxes[l->param[j]]);
        memset(l->tensors[j].data + n, 0, (p->shard_numel - n) * sizeof(float));
    }
}

bool train_state_try_save(const char *path, const ParamTable *params, const AdamW *opt,
                          TrainProgress progress, uint64_t seed, const char *config_yaml,
                          const CkptAttr *run_attrs, int n_run_attrs, MPI_Comm comm, char *err,
                          size_t errlen) {
    TensorList list = state_list(params, opt, opt && opt->ema);
    int n_attrs = 5 + n_run_attrs;
    CkptAttr *attrs = xcalloc((size_t)n_attrs, sizeof(CkptAttr));
    attrs[0] = (CkptAttr){.name = "step", .type = CKPT_INT, .i = progress.step};
    attrs[1] = (CkptAttr){.name = "optimizer_step", .type = CKPT_INT, .i = opt ? opt->step : 0};
    attrs[2] = (CkptAttr){.name = "data_windows_consumed", .type = CKPT_INT,
                          .i = progress.windows_consumed};
    attrs[3] = (CkptAttr){.name = "seed", .type = CKPT_INT, .i = (int64_t)seed};
    attrs[4] = (CkptAttr){.name = "config", .type = CKPT_STRING, .s = config_yaml};
    for (int i = 0; i < n_run_attrs; i++) attrs[5 + i] = run_attrs[i];
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
    TensorList list = state_list(params, opt, ema);
    ckpt_load(path, list.tensors, list.count);
    padding_zero(&list, params);
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
    static const int kinds[] = {EMA};
    float *const base[] = {params->shard_data};
    TensorList list = tensor_list(params, kinds, base, 1, NULL);
    ckpt_load(path, list.tensors, list.count);
    padding_zero(&list, params);
    tensor_list_free(&list);
}
