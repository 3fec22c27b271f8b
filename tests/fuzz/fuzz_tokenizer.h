// Shared by the tokenizer fuzz targets (header-only): loads a tokenizer path with
// tokenizer_try_load and, when it loads, checks what every loaded tokenizer must give:
// ids inside its vocabulary, the bytes of each id, and decode(encode(x)) == x for valid UTF-8
// text and for arbitrary bytes (byte fallback). A refusal (of the file, or of a text its regex
// fails to match) must be one non-empty line.
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"

static inline void fuzz_round_trip(const Tokenizer *t, const char *text, size_t len) {
    int32_t *ids = NULL;
    size_t cap = 0, back_len, n;
    char err[512] = "";
    if (!tokenizer_try_encode(t, text, len, &ids, &cap, &n, err, sizeof err)) {
        fuzz_refusal_check(err);  // a regex's match limit, hit on this text
        free(ids);
        return;
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tokenizer_vocab_size(t)) abort();
    char *back = tokenizer_decode(t, ids, n, &back_len);
    if (back_len != len || memcmp(back, text, len) != 0) abort();
    free(back);
    free(ids);
}

static inline void fuzz_tokenizer_check(const char *path, const uint8_t *data, size_t size) {
    static const char TEXT[] = "Hello, world! It's 2024: caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5"
                               "\xe6\x9c\xac \xf0\x9f\x98\x80  \n\tend of   text.\r\n";
    char err[512] = "";
    Tokenizer *t = tokenizer_try_load(path, err, sizeof err);
    if (!t) {
        fuzz_refusal_check(err);
        return;
    }
    int vocab = tokenizer_vocab_size(t);
    if (tokenizer_bos_id(t) >= vocab || tokenizer_eos_id(t) >= vocab) abort();
    for (int32_t id = 0; id < vocab && id < 512; id++) {
        size_t len;
        tokenizer_token_bytes(t, id, &len);
    }
    fuzz_round_trip(t, TEXT, sizeof TEXT - 1);
    fuzz_round_trip(t, (const char *)data, size < 64 ? size : 64);
    tokenizer_free(t);
}
