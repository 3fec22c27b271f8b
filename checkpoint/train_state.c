#include "checkpoint/train_state.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/errors.h"

enum { MODEL, EXP_AVG, EXP_AVG_SQ, N_KINDS };
static const char *const GROUP[N_KINDS] = {"/model/", "/optimizer/exp_avg/",
                                           "/optimizer/exp_avg_sq/"};

// One CkptTensor per parameter and kind; names[] keeps the dataset paths alive.
static CkptTensor *tensor_list(const ParamTable *params, const AdamW *opt, int n_kinds,
                               char (**names)[PARAM_NAME_MAX + 32]) {
    CkptTensor *list = xcalloc((size_t)params->count * n_kinds, sizeof(CkptTensor));
    *names = xcalloc((size_t)params->count * n_kinds, sizeof **names);
    for (int kind = 0; kind < n_kinds; kind++) {
        float *base = kind == MODEL ? params->shard_data : kind == EXP_AVG ? opt->exp_avg : opt->exp_avg_sq;
        for (int i = 0; i < params->count; i++) {
            const Param *p = &params->items[i];
            int j = kind * params->count + i;
            snprintf((*names)[j], sizeof (*names)[j], "%s%s", GROUP[kind], p->name);
            list[j] = (CkptTensor){(*names)[j], p->ndim, p->shape, base + p->shard_offset};
        }
    }
    return list;
}

void train_state_save(const char *path, const ParamTable *params, const AdamW *opt,
                      TrainProgress progress, uint64_t seed, const char *config_yaml,
                      const CkptAttr *model_attrs, int n_model_attrs) {
    int n_kinds = opt ? N_KINDS : 1;
    char(*names)[PARAM_NAME_MAX + 32];
    CkptTensor *list = tensor_list(params, opt, n_kinds, &names);
    int n_attrs = 5 + n_model_attrs;
    CkptAttr *attrs = xcalloc((size_t)n_attrs, sizeof(CkptAttr));
    attrs[0] = (CkptAttr){.name = "step", .type = CKPT_INT, .i = progress.step};
    attrs[1] = (CkptAttr){.name = "optimizer_step", .type = CKPT_INT, .i = opt ? opt->step : 0};
    attrs[2] = (CkptAttr){.name = "data_windows_consumed", .type = CKPT_INT,
                          .i = progress.windows_consumed};
    attrs[3] = (CkptAttr){.name = "seed", .type = CKPT_INT, .i = (int64_t)seed};
    attrs[4] = (CkptAttr){.name = "config", .type = CKPT_STRING, .s = config_yaml};
    for (int i = 0; i < n_model_attrs; i++) attrs[5 + i] = model_attrs[i];
    ckpt_save(path, list, params->count * n_kinds, attrs, n_attrs);
    free(attrs);
    free(list);
    free(names);
}

void train_state_load(const char *path, ParamTable *params, AdamW *opt, TrainProgress *progress) {
    char first_state[PARAM_NAME_MAX + 32];
    snprintf(first_state, sizeof first_state, "%s%s", GROUP[EXP_AVG], params->items[0].name);
    bool full = opt && ckpt_has(path, first_state);
    int n_kinds = full ? N_KINDS : 1;
    char(*names)[PARAM_NAME_MAX + 32];
    CkptTensor *list = tensor_list(params, opt, n_kinds, &names);
    ckpt_load(path, list, params->count * n_kinds);
    if (full) opt->step = (int)ckpt_read_int_in(path, "optimizer_step", 0, INT_MAX);
    if (progress) {
        progress->step = ckpt_read_int_in(path, "step", 0, INT_MAX);
        progress->windows_consumed =
            ckpt_read_int_in(path, "data_windows_consumed", 0, TRAIN_STATE_MAX_WINDOWS);
    }
    free(list);
    free(names);
}
