// A tiktoken rank file as Hugging Face's byte-level BPE tokenizer.json, the form transformers'
// TikTokenConverter makes of it and scripts/peer/hf_tokenizer.py writes (byte for byte).
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/errors.h"
#include "data/tokenizer_impl.h"

// GPT-2's map of the 256 bytes onto printable characters (encoder.py's bytes_to_unicode), each
// as its UTF-8 bytes.
typedef struct {
    char utf8[256][3];
    int len[256];
} ByteChars;

static void byte_chars_init(ByteChars *c) {
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        int cp = printable ? b : 256 + extra++;
        if (cp < 0x80) {
            c->utf8[b][0] = (char)cp, c->len[b] = 1;
        } else {
            c->utf8[b][0] = (char)(0xC0 | cp >> 6), c->utf8[b][1] = (char)(0x80 | (cp & 0x3F));
            c->len[b] = 2;
        }
    }
}

// The token's bytes as byte-level text, in buf (grown as needed); NUL-terminated.
static const char *byte_text(const ByteChars *c, const char *s, size_t n, char **buf,
                             size_t *cap) {
    *buf = xgrow(*buf, cap, 2 * n + 1, 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        memcpy(*buf + k, c->utf8[b], (size_t)c->len[b]);
        k += (size_t)c->len[b];
    }
    (*buf)[k] = '\0';
    return *buf;
}

// The ordinary tokens are the ranks 0..n-1; the special ones follow them.
static int32_t rank_count(const Tokenizer *t) {
    int32_t n = 0;
    while (n < t->n_ids && t->len[n] > 0 &&
           tokenizer_lookup(t, t->blob + t->start[n], (size_t)t->len[n]) == n)
        n++;
    return n;
}

static const char *token_text(const Tokenizer *t, const ByteChars *c, int32_t id, char **buf,
                              size_t *cap) {
    return byte_text(c, t->blob + t->start[id], (size_t)t->len[id], buf, cap);
}

// TikTokenConverter's merges: each token's splits into two tokens, by the token's rank, then
// by the left part's rank (distinct prefixes, so the right part never decides).
static json_t *merges_json(const Tokenizer *t, const ByteChars *c, int32_t n_ranks) {
    json_t *merges = json_array();
    char *buf = NULL;
    size_t cap = 0;
    for (int32_t id = 0; id < n_ranks; id++) {
        const char *s = t->blob + t->start[id];
        size_t n = (size_t)t->len[id];
        // splits at growing i have growing-length prefixes; order them by the prefix's rank
        int32_t left[256], right[256];
        int k = 0;
        for (size_t i = 1; i < n; i++) {
            int32_t l = tokenizer_lookup(t, s, i), r = tokenizer_lookup(t, s + i, n - i);
            if (l < 0 || r < 0) continue;
            CHECK(k < 256);
            int j = k++;
            for (; j > 0 && left[j - 1] > l; j--) left[j] = left[j - 1], right[j] = right[j - 1];
            left[j] = l, right[j] = r;
        }
        for (int j = 0; j < k; j++) {
            json_t *pair = json_array();
            json_array_append_new(pair, json_string(token_text(t, c, left[j], &buf, &cap)));
            json_array_append_new(pair, json_string(token_text(t, c, right[j], &buf, &cap)));
            json_array_append_new(merges, pair);
        }
    }
    free(buf);
    return merges;
}

static json_t *model_json(const Tokenizer *t, const ByteChars *c, int32_t n_ranks) {
    json_t *vocab = json_object();
    char *buf = NULL;
    size_t cap = 0;
    for (int32_t id = 0; id < n_ranks; id++)
        json_object_set_new(vocab, token_text(t, c, id, &buf, &cap), json_integer(id));
    free(buf);
    return json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE",
                     "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                     "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 1, "vocab", vocab,
                     "merges", merges_json(t, c, n_ranks));
}

// The special tokens after the ranks. Hugging Face's tokenizers numbers added tokens densely
// from the vocabulary's end whatever ids the file gives, so each id no token has (cl100k's 17
// holes) gets a placeholder that keeps the later ids where tiktoken has them.
static json_t *added_tokens_json(const Tokenizer *t, int32_t n_ranks) {
    json_t *added = json_array();
    for (int32_t id = n_ranks; id < t->n_ids; id++) {
        char hole[64];
        int n = snprintf(hole, sizeof hole, "<|titan_unused_id_%d|>", (int)id);
        bool has = t->len[id] >= 0;
        json_array_append_new(
            added, json_pack("{s:i, s:s%, s:b, s:b, s:b, s:b, s:b}", "id", id, "content",
                             has ? t->blob + t->start[id] : hole,
                             has ? (size_t)t->len[id] : (size_t)n, "single_word", 0, "lstrip", 0,
                             "rstrip", 0, "normalized", 0, "special", 1));
    }
    return added;
}

static json_t *tokenizer_json(const Tokenizer *t) {
    ByteChars c;
    byte_chars_init(&c);
    int32_t n_ranks = rank_count(t);
    json_t *pre = json_pack(
        "{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type", "Sequence",
        "pretokenizers", "type", "Split", "pattern", "Regex", PRETOKENIZE_CL100K, "behavior",
        "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1,
        "use_regex", 0);
    json_t *j = json_pack(
        "{s:s, s:n, s:n, s:o, s:n, s:o, s:n, s:{s:s, s:b, s:b, s:b}, s:o}", "version", "1.0",
        "truncation", "padding", "added_tokens", added_tokens_json(t, n_ranks), "normalizer",
        "pre_tokenizer", pre, "post_processor", "decoder", "type", "ByteLevel",
        "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1, "model",
        model_json(t, &c, n_ranks));
    CHECK(j != NULL);
    return j;
}

// The text of a special id, or JSON null for none.
static json_t *special_json(const Tokenizer *t, int32_t id) {
    return id < 0 ? json_null() : json_stringn(t->blob + t->start[id], (size_t)t->len[id]);
}

static bool dump(json_t *j, const char *dir, const char *name, char *err, size_t errlen) {
    char path[4096];
    CHECK(snprintf(path, sizeof path, "%s/%s", dir, name) < (int)sizeof path);
    // Python's json.dump(ensure_ascii=False): ", " and ": " between items, UTF-8 kept.
    int rc = json_dump_file(j, path, 0);
    json_decref(j);
    return rc == 0 || error_set(err, errlen, "cannot write %s", path);
}

bool tokenizer_write_hf(const Tokenizer *t, const char *dir, char *err, size_t errlen) {
    if (strcmp(t->format, "tiktoken"))
        return error_set(err, errlen, "only a tiktoken rank file converts to tokenizer.json, "
                         "not a %s tokenizer", t->format);
    if (!dump(tokenizer_json(t), dir, "tokenizer.json", err, errlen)) return false;
    // model_input_names as Llama 3's: without it PreTrainedTokenizerFast also returns
    // token_type_ids, which generate(**tokenizer(text)) refuses for a causal LM.
    json_t *config = json_pack(
        "{s:o, s:o, s:b, s:b, s:s, s:[s, s]}", "bos_token", special_json(t, t->bos), "eos_token",
        special_json(t, t->eos), "add_bos_token", 0, "add_eos_token", 0, "tokenizer_class",
        "PreTrainedTokenizerFast", "model_input_names", "input_ids", "attention_mask");
    return dump(config, dir, "tokenizer_config.json", err, errlen);
}
