// libFuzzer target: a tiktoken rank file ("<base64> <rank>" lines), as tokenizer_try_load
// reads a Llama 3 tokenizer.model or a `titan tokenizer train` output.
#include "tests/fuzz/fuzz_file.h"
#include "tests/fuzz/fuzz_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    fuzz_file_write("tokenizer.model", data, size, path, sizeof path);
    fuzz_tokenizer_check(path, data, size);
    return 0;
}
