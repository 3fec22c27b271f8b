// libFuzzer target: a safetensors file as safetensors_try_open reads a Hugging Face
// model.safetensors (its 8-byte header length, the JSON header, the data section), then every
// tensor it accepted read back as floats, as the HF loaders read them.
#include "checkpoint/safetensors.h"
#include "core/errors.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128], err[1024] = "";
    fuzz_file_write("model.safetensors", data, size, path, sizeof path);
    Safetensors st;
    if (!safetensors_try_open(path, &st, err, sizeof err)) {
        fuzz_refusal_check(err);
        return 0;
    }
    for (int i = 0; i < st.n_tensors; i++) {
        const SafetensorsTensor *t = &st.tensors[i];
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= (size_t)t->shape[d];
        // The tensors tile the file's data section, so numel is bounded by the input's size.
        float *out = xmalloc(numel * sizeof(float));
        if (!safetensors_try_read(&st, t->name, t->ndim, t->shape, out, err, sizeof err))
            fuzz_refusal_check(err);
        free(out);
    }
    safetensors_close(&st);
    return 0;
}
