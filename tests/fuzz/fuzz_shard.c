// libFuzzer target: a token dataset as token_stream_try_open reads one. The input is cut at
// each FUZZ_SHARD_SEP into up to MAX_SHARDS shard files of a folder (one file when the input
// has no separator), opened as a folder; when it opens, the windows around the end are read,
// the last ones wrapping around to the first as epochs do.
//
// A piece is a shard without the zero padding of its header (ints 3..255, which the reader
// ignores): its first 12 bytes are the magic, version and token count, the rest the tokens;
// the target puts the padding back. So a mutation of the header or the tokens is a small
// change of a small input. A piece shorter than 12 bytes is written as it is: a short file.
#include <string.h>
#include <sys/stat.h>

#include "data/shard.h"
#include "tests/fuzz/fuzz_file.h"

#define FUZZ_SHARD_SEP "titan-fuzz-next-shard"
#define MAX_SHARDS 4
#define HEADER_USED 12  // magic, version, count

static void piece_write(const char *name, const uint8_t *piece, size_t size) {
    static uint8_t file[SHARD_HEADER_INTS * 4 + (1 << 20)];
    char path[160];
    if (size < HEADER_USED || size - HEADER_USED > sizeof file - SHARD_HEADER_INTS * 4) {
        fuzz_file_write(name, piece, size, path, sizeof path);
        return;
    }
    memset(file, 0, SHARD_HEADER_INTS * 4);
    memcpy(file, piece, HEADER_USED);
    memcpy(file + SHARD_HEADER_INTS * 4, piece + HEADER_USED, size - HEADER_USED);
    fuzz_file_write(name, file, SHARD_HEADER_INTS * 4 + size - HEADER_USED, path, sizeof path);
}

// Writes the shards into a folder of their own, emptied of the last input's first.
static void shards_write(const uint8_t *data, size_t size, char *folder, size_t len) {
    char name[64], path[160];
    snprintf(folder, len, "%s/shards", fuzz_folder_path());
    mkdir(folder, 0700);
    for (int i = 0; i < MAX_SHARDS; i++) {
        snprintf(path, sizeof path, "%s/%d.bin", folder, i);
        unlink(path);
    }
    for (int i = 0; i < MAX_SHARDS && data; i++) {
        size_t head;
        const uint8_t *rest = fuzz_split(data, size, FUZZ_SHARD_SEP, &head);
        if (i + 1 == MAX_SHARDS) rest = NULL, head = size;  // the last takes what is left
        snprintf(name, sizeof name, "shards/%d.bin", i);
        piece_write(name, data, head);
        if (rest) size -= (size_t)(rest - data);
        data = rest;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char folder[128], err[1024] = "";
    shards_write(data, size, folder, sizeof folder);
    TokenStream s;
    if (!token_stream_try_open(&s, folder, err, sizeof err)) {
        fuzz_refusal_check(err);
        return 0;
    }
    int seq_len = 1 + (int)(size % 7);
    if (token_stream_num_tokens(&s) > seq_len) {
        int32_t window[8];
        int64_t n = token_stream_num_windows(&s, seq_len);
        for (int64_t w = n < 2 ? 0 : n - 2; w <= n + 1; w++)
            token_stream_window(&s, w, seq_len, window);
    }
    token_stream_close(&s);
    return 0;
}
