// libFuzzer target: a Hugging Face config.json as each architecture's reader takes it
// (`convert --to titan`, checkpoint.initial_load_in_hf): Llama's and Qwen3's (dense or MoE).
// An accepted config must describe a model whose sizes stay within the readers' limits
// (models/decoder/hf.h), so that nothing sized by them overflows.
#include "models/decoder/hf.h"
#include "models/llama3/llama3.h"
#include "models/qwen3/qwen3.h"
#include "tests/fuzz/fuzz_file.h"

static void accepted_check(const DecoderArgs *a) {
    bool ok = a->dim >= 1 && a->dim <= HF_MAX_WIDTH && a->n_layers >= 1 &&
              a->n_layers <= HF_MAX_LAYERS && a->n_heads >= 1 && a->n_heads <= HF_MAX_HEADS &&
              a->n_kv_heads >= 1 && a->n_heads % a->n_kv_heads == 0 && a->vocab_size >= 1 &&
              a->vocab_size <= HF_MAX_VOCAB && a->max_seq_len >= 1 &&
              (int64_t)a->max_seq_len * decoder_head_dim(a) <= HF_MAX_ROPE_TABLE;
    if (ok) return;
    fprintf(stderr, "fuzz: an accepted config.json outside the limits: dim %d, %d layers, %d/%d "
            "heads, vocab %d, %d positions\n", a->dim, a->n_layers, a->n_heads, a->n_kv_heads,
            a->vocab_size, a->max_seq_len);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128], err[1024] = "";
    fuzz_file_write("config.json", data, size, path, sizeof path);
    LlamaArgs llama;
    if (llama3_try_args_from_hf(fuzz_folder_path(), &llama, err, sizeof err))
        accepted_check(&llama);
    else fuzz_refusal_check(err);
    Qwen3Args qwen3;
    err[0] = '\0';
    if (qwen3_try_args_from_hf(fuzz_folder_path(), &qwen3, err, sizeof err))
        accepted_check(&qwen3.decoder);
    else fuzz_refusal_check(err);
    return 0;
}
