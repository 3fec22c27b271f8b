// Pre-tokenization: the regex that cuts text into pieces before byte-pair merging, exactly as
// tiktoken and Hugging Face tokenizers apply it (PCRE2 with Unicode properties).
//
// Invalid UTF-8 is handled by byte fallback: each byte that is not part of a valid UTF-8
// sequence becomes a piece of its own (and so encodes to its single-byte token), and the valid
// runs around it are split by the regex as usual. Nothing is dropped, so decode(encode(x)) == x
// for any byte string.
#pragma once

#include <stdbool.h>
#include <stddef.h>

// cl100k_base's pattern, which Llama 3 also uses.
#define PRETOKENIZE_CL100K                                                                     \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+" \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
// GPT-2's pattern (encoder.py).
#define PRETOKENIZE_GPT2                                                                       \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

typedef struct Pretokenizer Pretokenizer;
typedef void (*PieceFn)(const char *piece, size_t len, void *ctx);

// Compiles (and JIT-compiles) the pattern; false with a one-line reason on a bad pattern or
// one that fails to match (a PCRE2 error such as a match limit) on a short sample text. name
// (the tokenizer file: "tokenizer <path>") leads the error line of a later failed match.
bool pretokenizer_try_create(Pretokenizer **out, const char *pattern, const char *name,
                             char *err, size_t errlen);
void pretokenizer_free(Pretokenizer *p);
// Calls fn on each piece of text[0, len) in order; the pieces tile the text exactly.
// Thread-safe: several threads may split with one Pretokenizer at once. A match that fails
// with a PCRE2 error (a match or depth limit the pattern sets) is a user error (exit 2)
// naming the pattern's source and PCRE2's message, never read as "no match".
void pretokenizer_split(const Pretokenizer *p, const char *text, size_t len, PieceFn fn,
                        void *ctx);
// pretokenizer_split, but returns the PCRE2 error code (< 0) that stopped it, 0 when whole.
int pretokenizer_try_split(const Pretokenizer *p, const char *text, size_t len, PieceFn fn,
                           void *ctx);
// The one-line reason for pretokenizer_try_split's error rc, naming the pattern's source;
// returns false (error_set's convention).
bool pretokenizer_split_error(const Pretokenizer *p, int rc, char *err, size_t errlen);
// Length of the longest prefix of s[0, len) that is valid UTF-8.
size_t utf8_valid_prefix(const char *s, size_t len);
