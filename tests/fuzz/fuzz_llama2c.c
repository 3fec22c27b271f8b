// libFuzzer target: a llama2.c checkpoint (7 int32 then fp32 weights), as `titan generate`
// reads one. A file its header accepts is exactly the size the header implies, so the model it
// describes is no larger than the input: the target builds it and loads the weights, which
// must then succeed.
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "models/llama3/llama3.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128], err[1024] = "";
    fuzz_file_write("model.bin", data, size, path, sizeof path);
    LlamaArgs args;
    if (!llama3_try_args_from_llama2c(path, &args, err, sizeof err)) {
        fuzz_refusal_check(err);
        return 0;
    }
    Model m;
    Arena weights, no_grads;  // as titan generate loads a model: no gradient buffers
    decoder_build(&m, &args, false);
    arena_init_sizing(&weights, "params");
    arena_init_sizing(&no_grads, "grads");
    params_allocate(&m.params, &weights, &no_grads);
    arena_commit(&weights, NULL);
    params_allocate(&m.params, &weights, &no_grads);
    if (!llama3_try_load_llama2c(path, &m, err, sizeof err)) abort();
    decoder_free(&m);
    arena_free(&weights);
    return 0;
}
