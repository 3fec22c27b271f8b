// libFuzzer target: GPT-2's two files, encoder.json and vocab.bpe, loaded as their folder.
// The input is encoder.json then vocab.bpe, cut where "#version" (vocab.bpe's first line)
// first appears, so the two real files back to back are one input; without it, vocab.bpe
// is that line alone (no merges).
#include <stdbool.h>

#include "tests/fuzz/fuzz_file.h"
#include "tests/fuzz/fuzz_tokenizer.h"

#define MERGES_START "#version"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char NO_MERGES[] = MERGES_START ": 0.2\n";
    char path[128];
    size_t head;
    bool merges = fuzz_split(data, size, MERGES_START, &head) != NULL;
    fuzz_file_write("encoder.json", data, head, path, sizeof path);
    if (merges)
        fuzz_file_write("vocab.bpe", data + head, size - head, path, sizeof path);
    else
        fuzz_file_write("vocab.bpe", (const uint8_t *)NO_MERGES, sizeof NO_MERGES - 1, path,
                        sizeof path);
    fuzz_tokenizer_check(fuzz_folder_path(), data, size);
    return 0;
}
