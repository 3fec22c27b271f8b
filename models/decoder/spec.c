// The registry functions shared by the decoder's architectures (decoder_spec.h).
#include <stdlib.h>

#include "core/errors.h"
#include "models/decoder/decoder_spec.h"
#include "models/decoder/hf.h"

_Static_assert(DECODER_MAX_ATTRS <= MODEL_MAX_ATTRS, "a decoder describes itself in more attributes");

// A spec is a decoder's when it builds through decoder_spec_build; its args then begin with
// DecoderArgs (a union member's first member is at the union's address, C11 6.7.2.1).
const DecoderArgs *decoder_args_of(const ModelArgs *a) {
    CHECK(a->spec && a->spec->build == decoder_spec_build);
    return (const DecoderArgs *)&a->as;
}

ModelShape decoder_spec_shape(const ModelArgs *a) {
    const DecoderArgs *d = decoder_args_of(a);
    return (ModelShape){.n_layers = d->n_layers, .dim = d->dim,
                        .kv_dim = d->n_kv_heads * decoder_head_dim(d),
                        .head_dim = decoder_head_dim(d), .vocab_size = d->vocab_size,
                        .max_seq_len = d->max_seq_len,
                        .tie_word_embeddings = d->tie_word_embeddings,
                        .moe = decoder_has_moe(d) ? &d->moe : NULL,
                        .dense_layers = d->n_dense_layers, .mtp_layers = d->mtp_layers};
}

void decoder_spec_build(Model *m, const ModelArgs *a, bool activation_checkpoint) {
    DecoderArgs args = *decoder_args_of(a);
    args.lora = a->lora;
    decoder_build(m, &args, activation_checkpoint);
}

const char *decoder_spec_tp_check(const ModelArgs *a, int tp, int B, int T, char *err,
                                  size_t len) {
    return decoder_tp_check(decoder_args_of(a), tp, B, T, err, len);
}

uint64_t decoder_spec_tp_bytes_per_microbatch(const ModelArgs *a, int tp, int B, int T,
                                              int recomputed_layers, bool loss_parallel,
                                              int first_block, int last_block) {
    return decoder_tp_bytes_per_microbatch(decoder_args_of(a), tp, B, T, recomputed_layers,
                                           loss_parallel, first_block, last_block);
}

int decoder_spec_describe(const ModelArgs *a, CkptAttr *out) {
    return decoder_describe(decoder_args_of(a), out);
}

void *decoder_spec_kv_cache_new(const Model *m, int max_ctx, const KernelOps *k) {
    DecoderKVCache *c = xmalloc(sizeof *c);
    decoder_kv_cache_init(c, m, max_ctx, k);
    return c;
}

const float *decoder_spec_decode_step(const Model *m, void *cache, const KernelOps *k, int token,
                                      int pos) {
    return decoder_decode_step(m, cache, k, token, pos);
}

void decoder_spec_kv_cache_free(void *cache) {
    decoder_kv_cache_free(cache);
    free(cache);
}

void decoder_spec_save_peft(const char *dir, const ModelArgs *a, const ParamTable *params,
                            const LoraSection *lora) {
    decoder_save_peft(dir, decoder_args_of(a), params, lora);
}
