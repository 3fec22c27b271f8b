// libFuzzer target: a Hugging Face tokenizer.json (or, by its content, a GPT-2 encoder.json
// without its vocab.bpe), as tokenizer_try_load reads one.
#include "tests/fuzz/fuzz_file.h"
#include "tests/fuzz/fuzz_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    fuzz_file_write("tokenizer.json", data, size, path, sizeof path);
    fuzz_tokenizer_check(path, data, size);
    return 0;
}
