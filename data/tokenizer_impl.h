// Private to data/tokenizer*.c: the Tokenizer's layout and the calls the loaders build it with.
//
// Every format becomes the same three tables: the bytes of each id, a hash from bytes to the
// id of each ordinary token (special tokens are left out, so encode never produces them), and
// a hash from an adjacent id pair to the rank of its merge and the id it merges into. The BPE
// loop then works on ids alone, whatever the file was.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/jinja.h"
#include "data/pretokenize.h"
#include "data/tokenizer.h"

// Far above any vocabulary; it bounds what a corrupt file's ids can make the loaders allocate.
#define TOKENIZER_MAX_IDS (1 << 24)

// Open addressing over token bytes. A slot keeps its token's place in the blob beside the id
// and the hash's low bits, so that a probe touches one cache line before the bytes themselves.
typedef struct {
    uint32_t tag, start, len;
    int32_t id;  // -1: empty
} ByteSlot;

typedef struct {
    ByteSlot *slots;
    size_t mask, count;
} ByteTable;

// Open addressing over (left << 32 | right) id pairs; UINT64_MAX marks an empty slot.
typedef struct {
    uint64_t key;
    int32_t rank, merged;
} PairSlot;

typedef struct {
    PairSlot *slots;
    size_t mask, count;
} PairTable;

struct Tokenizer {
    const char *format;
    uint64_t serial;        // unique per tokenizer made, so per-thread memos tell them apart
    int32_t n_ids, id_cap;  // n_ids: 1 + the largest id; id_cap: the arrays' capacity
    int32_t bos, eos;
    char *blob;             // every token's bytes, back to back
    size_t blob_len, blob_cap;
    size_t *start;          // (id_cap) offset of each id's bytes in blob
    int32_t *len;           // (id_cap) byte count of each id; -1 for an id no token has
    ByteTable tokens;
    PairTable pairs;
    int32_t byte_ids[256];  // the token of each single byte, where BPE starts
    Pretokenizer *pretok;   // NULL for the bytes tokenizer, which needs no pieces
    // The added tokens (the special ones, and a tokenizer.json's other added_tokens such as
    // Qwen3's <think>), longest first once loaded, and a bitmap of their first bytes: text a
    // chat template renders is split at them (tokenizer_encode_chat).
    int32_t *added;
    size_t n_added, added_cap;
    uint8_t added_first[32];
    Jinja *chat;            // the chat template beside the file; NULL: none, or chat_error
    char *chat_error;       // why there is none (malloc'd)
    // tokenizer_config.json's special tokens (bos_token, eos_token, ...: transformers'
    // special_tokens_map), their text, the chat template's variables; an empty object if none.
    json_t *chat_specials;
};

Tokenizer *tokenizer_new(const char *format);
// Records id as an added token (tokenizer_add_token does so for every special one).
void tokenizer_mark_added(Tokenizer *t, int32_t id);
// Ends loading a file's tokenizer: orders the added tokens and reads the chat template of the
// tokenizer_config.json (or chat_template.jinja) beside path.
void tokenizer_chat_load(Tokenizer *t, const char *path);
// Gives id the bytes s[0, n), n > 0; ordinary tokens also become encodable, special ones do not.
// False (and nothing changed) when the id or, for an ordinary token, the bytes are taken.
bool tokenizer_add_token(Tokenizer *t, int32_t id, const char *s, size_t n, bool special);
// The ordinary token with bytes s[0, n), or -1.
int32_t tokenizer_lookup(const Tokenizer *t, const char *s, size_t n);
// The same, given h = tokenizer_hash(s, n), for a caller that keys more on that hash.
int32_t tokenizer_lookup_hashed(const Tokenizer *t, const char *s, size_t n, uint64_t h);
uint64_t tokenizer_hash(const char *s, size_t n);
// Any id (special ones included) whose bytes are s[0, n), or -1; a scan, for loading only.
int32_t tokenizer_scan(const Tokenizer *t, const char *s, size_t n);
// Records that the pair (left, right) merges into `merged` with this rank and returns -1; a
// pair recorded before keeps its merge and its rank is returned (a merge list that repeats a
// pair is refused: GPT-2's bpe.py and Hugging Face let the last repeat win, titan the first).
int32_t tokenizer_add_merge(Tokenizer *t, int32_t left, int32_t right, int32_t rank,
                            int32_t merged);
// The merge of the pair (left, right): false when the pair never merges.
bool tokenizer_pair_find(const Tokenizer *t, int32_t left, int32_t right, int32_t *rank,
                         int32_t *merged);
// tiktoken's rule for rank files: two tokens merge when their concatenation is a token, with
// that token's rank (= id). Records every such pair of the current vocabulary.
void tokenizer_merges_from_ranks(Tokenizer *t);
// Ends loading: finds the single-byte tokens BPE starts from and compiles the pattern (NULL
// for none). False with a reason naming path when the vocabulary or pattern is unusable.
bool tokenizer_finish(Tokenizer *t, const char *pattern, const char *path, char *err,
                      size_t errlen);

// Shared by the loaders (data/tokenizer_load.c, data/tokenizer_json.c).
// The whole file, NUL-terminated (*len excludes the NUL); NULL and a reason naming it.
char *tokenizer_read_file(const char *path, size_t *len, char *err, size_t errlen);
// The file `name` in the folder that holds path.
void tokenizer_sibling_path(const char *path, const char *name, char *out, size_t outlen);
// A tokenizer.json or a GPT-2 encoder.json, text[0, len) being the file's content.
Tokenizer *tokenizer_load_json(const char *path, const char *text, size_t len, char *err,
                               size_t errlen);
// GPT-2 from its vocab.bpe (path) and the encoder.json beside it.
Tokenizer *tokenizer_load_gpt2_merges(const char *path, char *err, size_t errlen);
