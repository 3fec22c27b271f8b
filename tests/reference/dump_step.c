// One forward/backward of titan on a checkpoint's weights and the first B windows of a token
// stream, written as HDF5 for tests/reference/check_step.py to compare against PyTorch:
//   dump_step CKPT.h5 DATA B T OUT.h5 [--mask-first K [--garbage-masked]]
// --mask-first K: a loss mask ignoring the first K targets of each row (an SFT prompt's), as
// /mask (B, T); --garbage-masked: those targets replaced by other token ids, which the loss
// must ignore as it ignores the true ones.
// OUT holds /tokens (B, T+1), /loss (1), /logits (B*T, vocab) and /grad/<fqn> for every
// parameter trained (the gradient of the mean loss; under LoRA the adapters'), all float32.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/train_state.h"
#include "core/errors.h"
#include "data/shard.h"
#include "data/token_batch.h"
#include "models/lora.h"
#include "models/registry.h"
#include "parallel/grads.h"

int main(int argc, char **argv) {
    bool masked = argc >= 8 && !strcmp(argv[6], "--mask-first");
    bool garbage = masked && argc == 9 && !strcmp(argv[8], "--garbage-masked");
    if (argc != 6 && !(masked && (argc == 8 || garbage)))
        die_user("usage: dump_step CKPT.h5 DATA B T OUT.h5 [--mask-first K [--garbage-masked]]");
    const char *ckpt = argv[1], *data = argv[2], *out = argv[5];
    int B = atoi(argv[3]), T = atoi(argv[4]), prompt = masked ? atoi(argv[7]) : 0;
    const KernelOps *k = kernels_backend("cpu");
    const ModelSpec *spec = model_spec_of_checkpoint(ckpt, NULL);
    ModelArgs args;
    spec->args_from_checkpoint(ckpt, &args);
    spec->update_from_config(&args, NULL, 0, T);
    int vocab_size = model_shape(&args).vocab_size;
    // A run with LoRA (its config, in the checkpoint) has the adapters: the build adds them.
    Config cfg;
    config_defaults(&cfg);
    char *yaml = ckpt_read_string(ckpt, "config"), err[1024];
    if (!config_parse_text(&cfg, ckpt, yaml, strlen(yaml), err, sizeof err)) die_user("%s", err);
    free(yaml);
    args.lora = config_converts(&cfg, "lora") ? &cfg.lora : NULL;
    Model m;
    spec->build(&m, &args, false);
    if (args.lora) model_convert_lora(&m, &cfg);
    Arena params, grads, acts;
    model_allocate(&m, model_activation_bytes(&m, k, B, T), &params, &grads, &acts, NULL);
    train_state_load(ckpt, &m.params, NULL, NULL);

    TokenStream stream;
    token_stream_open(&stream, data);
    int32_t *window = xmalloc(sizeof(int32_t) * (T + 1));
    float *tokens = xmalloc(sizeof(float) * B * (T + 1));
    int *inputs = xmalloc(sizeof(int) * B * T), *targets = xmalloc(sizeof(int) * B * T);
    int *pos = xmalloc(sizeof(int) * T);
    for (int t = 0; t < T; t++) pos[t] = t;
    for (int r = 0; r < B; r++) {
        token_stream_window(&stream, r, T, window);
        for (int t = 0; t <= T; t++) tokens[r * (T + 1) + t] = (float)window[t];
        memcpy(inputs + r * T, window, sizeof(int) * T);
        memcpy(targets + r * T, window + 1, sizeof(int) * T);
    }

    int *mask = xmalloc(sizeof(int) * B * T);
    float *mask_out = xmalloc(sizeof(float) * B * T);
    int counted = 0;
    for (int i = 0; i < B * T; i++) {
        mask[i] = i % T >= prompt;
        mask_out[i] = (float)mask[i];
        counted += mask[i];
        if (garbage && !mask[i]) targets[i] = (targets[i] * 7 + 13) % vocab_size;
    }
    TokenBatch batch = {.tokens = inputs, .targets = targets, .pos = pos,
                        .loss_mask = masked ? mask : NULL};
    StepCtx s = {.k = k, .act = &acts, .B = B, .T = T, .input = &batch, .loss_scale = 1.0f,
                 .loss_tokens = masked ? counted : 0};
    size_t n_logits = (size_t)B * T * vocab_size;
    float *logits = xmalloc(sizeof(float) * n_logits);
    model_forward(&m, &s);
    memcpy(logits, s.output, sizeof(float) * n_logits);
    arena_release(&acts, 0);
    float loss = (float)model_forward_backward(&m, &s);
    grads_sum_copies(k, &m.params, NULL);  // a copy's (Param.copy) is its original's gradient

    int n = 3;  // the tensors: tokens, loss, logits, the mask, then each parameter's gradient
    CkptTensor *list = xcalloc(m.params.count + 4, sizeof(CkptTensor));
    char (*names)[PARAM_NAME_MAX + 8] = xcalloc(m.params.count, sizeof *names);
    int64_t tok_shape[2] = {B, T + 1}, one = 1, logit_shape[2] = {(int64_t)B * T, vocab_size};
    list[0] = (CkptTensor){.path = "/tokens", .ndim = 2, .shape = tok_shape, .data = tokens};
    list[1] = (CkptTensor){.path = "/loss", .ndim = 1, .shape = &one, .data = &loss};
    list[2] = (CkptTensor){.path = "/logits", .ndim = 2, .shape = logit_shape, .data = logits};
    int64_t mask_shape[2] = {B, T};
    if (masked)
        list[n++] = (CkptTensor){.path = "/mask", .ndim = 2, .shape = mask_shape, .data = mask_out};
    for (int i = 0; i < m.params.count; i++) {
        Param *p = &m.params.items[i];
        if (p->copy || p->frozen) continue;  // a frozen weight takes no gradient
        snprintf(names[i], sizeof names[i], "/grad/%s", p->name);
        list[n++] = (CkptTensor){.path = names[i], .ndim = p->ndim, .shape = p->shape,
                                 .data = p->grad};
    }
    ckpt_save(out, list, n, NULL, 0, MPI_COMM_NULL);
    printf("dump_step: loss %.7f, %d gradients -> %s\n", loss, n - 3 - masked, out);
    return 0;
}
