// The byte-level BPE formats: Hugging Face's tokenizer.json and GPT-2's encoder.json +
// vocab.bpe. Both spell tokens in GPT-2's byte-level alphabet and list merges in rank order.
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/errors.h"
#include "data/tokenizer_impl.h"

// GPT-2's bytes_to_unicode (encoder.py): printable Latin-1 bytes stand for themselves, the 68
// others for U+0100.. in byte order, so that every token is printable text.
#define BYTE_LEVEL_CODEPOINTS (256 + 68)
#define GPT2_EOT "<|endoftext|>"  // GPT-2's one special token: BOS and EOS both

typedef struct {
    int16_t byte_of[BYTE_LEVEL_CODEPOINTS];  // -1: not in the alphabet
    char *buf;                               // the bytes decoded so far
    size_t cap;
} ByteLevel;

static void bytelevel_init(ByteLevel *b) {
    *b = (ByteLevel){.buf = NULL};
    int next = 256;
    for (int c = 0; c < BYTE_LEVEL_CODEPOINTS; c++) b->byte_of[c] = -1;
    for (int c = 0; c < 256; c++) {
        bool printable = (c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) || c >= 0xae;
        b->byte_of[printable ? c : next++] = (int16_t)c;
    }
}

// Appends the bytes that the byte-level text s[0, n) stands for to b->buf at *at; false when
// s has a character outside the alphabet (all of which take one or two UTF-8 bytes).
static bool bytelevel_decode(ByteLevel *b, const char *s, size_t n, size_t *at) {
    if (*at + n > b->cap) {
        b->cap = 2 * (*at + n) + 256;
        b->buf = realloc(b->buf, b->cap);
        CHECK(b->buf);
    }
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned cp = u[i++];
        if (cp >= 0x80) {
            if ((cp & 0xe0) != 0xc0 || i == n || (u[i] & 0xc0) != 0x80) return false;
            cp = (cp & 0x1f) << 6 | (u[i++] & 0x3f);
        }
        if (cp >= BYTE_LEVEL_CODEPOINTS || b->byte_of[cp] < 0) return false;
        b->buf[(*at)++] = (char)b->byte_of[cp];
    }
    return true;
}

static bool json_fail(const char *path, const json_error_t *e, char *err, size_t errlen) {
    char text[4 * JSON_ERROR_TEXT_LENGTH];
    return error_set(err, errlen, "tokenizer %s: invalid JSON at line %d, column %d: %s", path,
                     e->line, e->column, error_escape(text, sizeof text, e->text));
}

// An id from JSON, or -1 when v is not one.
static int32_t json_id(const json_t *v) {
    json_int_t id = json_integer_value(v);
    return json_is_integer(v) && id >= 0 && id < TOKENIZER_MAX_IDS ? (int32_t)id : -1;
}

// A refusal naming a vocab entry.
static bool vocab_fail(const char *path, const char *key, const char *why, char *err,
                       size_t errlen) {
    char text[256];
    return error_set(err, errlen, "tokenizer %s: vocab entry \"%s\" %s", path,
                     error_escape(text, sizeof text, key), why);
}

// An entry for an id that has a token already is only an added token restated (GPT-2's
// <|endoftext|>): its text, raw or byte-level, must be that token's.
static bool vocab_restates(const Tokenizer *t, ByteLevel *b, int32_t id, const char *key) {
    size_t n = 0, len = strlen(key);
    const char *bytes = t->blob + t->start[id];
    if ((size_t)t->len[id] == len && memcmp(bytes, key, len) == 0) return true;
    return bytelevel_decode(b, key, len, &n) && (size_t)t->len[id] == n &&
           memcmp(bytes, b->buf, n) == 0;
}

static bool vocab_add(Tokenizer *t, ByteLevel *b, json_t *vocab, const char *path, char *err,
                      size_t errlen) {
    const char *key;
    json_t *value;
    json_object_foreach(vocab, key, value) {
        int32_t id = json_id(value);
        size_t n = 0;
        if (id < 0) return vocab_fail(path, key, "has no valid id", err, errlen);
        if (id < t->n_ids && t->len[id] >= 0) {
            if (vocab_restates(t, b, id, key)) continue;
            char why[64];
            snprintf(why, sizeof why, "has id %d, which another token has", id);
            return vocab_fail(path, key, why, err, errlen);
        }
        if (!bytelevel_decode(b, key, strlen(key), &n) || n == 0)
            return vocab_fail(path, key, "is not byte-level text", err, errlen);
        if (!tokenizer_add_token(t, id, b->buf, n, false))
            return vocab_fail(path, key, "repeats a token", err, errlen);
    }
    return true;
}

// Ids index dense tables (an id without bytes cannot be decoded), so every id up to the
// largest must have a token.
static bool ids_dense(const Tokenizer *t, const char *path, char *err, size_t errlen) {
    for (int32_t id = 0; id < t->n_ids; id++)
        if (t->len[id] < 0)
            return error_set(err, errlen,
                             "tokenizer %s: no token has id %d, below the largest id %d (ids run "
                             "0, 1, 2, ... without gaps)",
                             path, id, t->n_ids - 1);
    return true;
}

// The merge left + right of this rank; false unless both and their concatenation are tokens
// and the pair has no merge yet (*earlier: that merge's rank, -1 for the other reasons).
static bool merge_add(Tokenizer *t, ByteLevel *b, const char *left, size_t nl,
                      const char *right, size_t nr, int32_t rank, int32_t *earlier) {
    size_t cut = 0, n;
    *earlier = -1;
    if (!bytelevel_decode(b, left, nl, &cut)) return false;
    n = cut;
    if (!bytelevel_decode(b, right, nr, &n)) return false;
    int32_t l = tokenizer_lookup(t, b->buf, cut), r = tokenizer_lookup(t, b->buf + cut, n - cut);
    int32_t merged = tokenizer_lookup(t, b->buf, n);
    if (l < 0 || r < 0 || merged < 0) return false;
    *earlier = tokenizer_add_merge(t, l, r, rank, merged);
    return *earlier < 0;
}

// A tokenizer.json merge is "left right" (byte-level text has no spaces) or [left, right].
static bool hf_merge_add(Tokenizer *t, ByteLevel *b, const json_t *m, int32_t rank,
                         int32_t *earlier) {
    const char *l = json_string_value(m), *r = l ? strchr(l, ' ') : NULL;
    *earlier = -1;
    if (r) return merge_add(t, b, l, (size_t)(r - l), r + 1, strlen(r + 1), rank, earlier);
    l = json_string_value(json_array_get(m, 0)), r = json_string_value(json_array_get(m, 1));
    return l && r && json_array_size(m) == 2 &&
           merge_add(t, b, l, strlen(l), r, strlen(r), rank, earlier);
}

static bool hf_merges_add(Tokenizer *t, ByteLevel *b, const json_t *merges, const char *path,
                          char *err, size_t errlen) {
    size_t i;
    json_t *m;
    int32_t earlier;
    json_array_foreach(merges, i, m) {
        if (hf_merge_add(t, b, m, (int32_t)i, &earlier)) continue;
        if (earlier >= 0)
            return error_set(err, errlen, "tokenizer %s: merge %zu repeats merge %d", path, i,
                             earlier);
        return error_set(err, errlen, "tokenizer %s: merge %zu is not a pair of vocab tokens",
                         path, i);
    }
    return true;
}

// Added tokens first, so that the vocab entries they restate (GPT-2's <|endoftext|>) stay
// special; special ones are never produced by encode.
static bool hf_added_tokens_add(Tokenizer *t, const json_t *added, const char *path, char *err,
                                size_t errlen) {
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        int32_t id = json_id(json_object_get(a, "id"));
        const char *content = json_string_value(json_object_get(a, "content"));
        bool special = json_is_true(json_object_get(a, "special"));
        if (id < 0 || !content || !*content ||
            !tokenizer_add_token(t, id, content, strlen(content), special))
            return error_set(err, errlen, "tokenizer %s: added_tokens[%zu] is not a new token",
                             path, i);
        if (!special) tokenizer_mark_added(t, id);
    }
    return true;
}

// The regex of a byte-level pre-tokenizer: Llama 3's Sequence of a Split (its regex) and a
// ByteLevel that applies none, or GPT-2's lone ByteLevel (its own regex). "" for a member that
// adds no regex; NULL for anything that would cut pieces otherwise (a prefix space, two regexes).
static const char *hf_pattern(const json_t *pre) {
    const char *type = json_string_value(json_object_get(pre, "type"));
    if (type && strcmp(type, "Split") == 0)
        return json_string_value(json_object_get(json_object_get(pre, "pattern"), "Regex"));
    if (type && strcmp(type, "ByteLevel") == 0) {
        if (json_is_true(json_object_get(pre, "add_prefix_space"))) return NULL;
        return json_is_false(json_object_get(pre, "use_regex")) ? "" : PRETOKENIZE_GPT2;
    }
    if (!type || strcmp(type, "Sequence") != 0) return NULL;
    const char *pattern = "";
    size_t i;
    json_t *member;
    json_array_foreach(json_object_get(pre, "pretokenizers"), i, member) {
        const char *own = hf_pattern(member);
        if (!own || (*own && *pattern)) return NULL;
        if (*own) pattern = own;
    }
    return pattern;
}

// tokenizer_config.json's bos_token or eos_token: a string or {"content": ...}.
static int32_t config_token(const Tokenizer *t, const json_t *config, const char *key) {
    const json_t *v = json_object_get(config, key);
    const char *s = json_is_string(v) ? json_string_value(v)
                                      : json_string_value(json_object_get(v, "content"));
    return s ? tokenizer_scan(t, s, strlen(s)) : -1;
}

static int32_t name_token(const Tokenizer *t, const char *name, const char *fallback) {
    int32_t id = tokenizer_scan(t, name, strlen(name));
    return id >= 0 ? id : tokenizer_scan(t, fallback, strlen(fallback));
}

// BOS and EOS as transformers reads them (tokenizer_config.json beside the file), else by
// the names Llama 3 and GPT-2 give them.
static bool hf_bos_eos_set(Tokenizer *t, const char *path, char *err, size_t errlen) {
    char config_path[PATH_MAX];
    tokenizer_sibling_path(path, "tokenizer_config.json", config_path, sizeof config_path);
    json_t *config = NULL;
    json_error_t jerr;
    // Reals, because transformers writes model_max_length as 1e30 spelt out as an integer.
    if (access(config_path, R_OK) == 0 &&
        !(config = json_load_file(config_path, JSON_DECODE_INT_AS_REAL, &jerr)))
        return json_fail(config_path, &jerr, err, errlen);
    t->bos = config_token(t, config, "bos_token");
    t->eos = config_token(t, config, "eos_token");
    if (t->bos < 0) t->bos = name_token(t, "<|begin_of_text|>", "<|endoftext|>");
    if (t->eos < 0) t->eos = name_token(t, "<|end_of_text|>", "<|endoftext|>");
    json_decref(config);
    return true;
}

static Tokenizer *load_huggingface(json_t *root, const char *path, char *err,
                                   size_t errlen) {
    json_t *model = json_object_get(root, "model");
    const char *type = json_string_value(json_object_get(model, "type"));
    char text[256];
    if (!type || strcmp(type, "BPE") != 0)
        return error_set(err, errlen, "tokenizer %s: not a BPE tokenizer (model.type is %s)",
                         path, type ? error_escape(text, sizeof text, type) : "missing"),
               NULL;
    const char *pattern = hf_pattern(json_object_get(root, "pre_tokenizer"));
    if (!pattern || !*pattern)
        return error_set(err, errlen,
                         "tokenizer %s: pre_tokenizer is neither a Split regex then ByteLevel nor "
                         "a ByteLevel with its regex and no prefix space",
                         path),
               NULL;
    const json_t *normalizer = json_object_get(root, "normalizer");
    if (normalizer && !json_is_null(normalizer))
        return error_set(err, errlen, "tokenizer %s: normalizers are not supported", path), NULL;
    Tokenizer *t = tokenizer_new("huggingface");
    ByteLevel b;
    bytelevel_init(&b);
    bool ok = hf_added_tokens_add(t, json_object_get(root, "added_tokens"), path, err, errlen) &&
              vocab_add(t, &b, json_object_get(model, "vocab"), path, err, errlen) &&
              ids_dense(t, path, err, errlen) &&
              hf_merges_add(t, &b, json_object_get(model, "merges"), path, err, errlen) &&
              tokenizer_finish(t, pattern, path, err, errlen) &&
              hf_bos_eos_set(t, path, err, errlen);
    free(b.buf);
    if (!ok) tokenizer_free(t);
    return ok ? t : NULL;
}

static bool gpt2_merge_add(Tokenizer *t, ByteLevel *b, const char *line, size_t n, int32_t rank,
                           int32_t *earlier) {
    const char *space = memchr(line, ' ', n);
    size_t nl = space ? (size_t)(space - line) : 0;
    *earlier = -1;
    return space && merge_add(t, b, line, nl, space + 1, n - nl - 1, rank, earlier);
}

// vocab.bpe: a "#version" line, then one "left right" merge a line in rank order.
static bool gpt2_merges_add(Tokenizer *t, ByteLevel *b, const char *text, const char *path,
                            char *err, size_t errlen) {
    int32_t rank = 0, earlier;
    const char *line = text;
    for (int lineno = 1; *line; lineno++) {
        const char *eol = strchrnul(line, '\n');
        size_t n = (size_t)(eol - line);
        if (lineno > 1 && n > 0 && !gpt2_merge_add(t, b, line, n, rank++, &earlier)) {
            if (earlier >= 0)
                return error_set(err, errlen, "tokenizer %s:%d: repeats merge %d (counting from "
                                 "0 after the #version line)", path, lineno, earlier);
            return error_set(err, errlen, "tokenizer %s:%d: not a merge of two vocab tokens",
                             path, lineno);
        }
        line = *eol ? eol + 1 : eol;
    }
    return true;
}

static Tokenizer *load_gpt2(json_t *encoder, const char *encoder_path, const char *bpe_path,
                            char *err, size_t errlen) {
    size_t len;
    char *merges = tokenizer_read_file(bpe_path, &len, err, errlen);
    if (!merges) return NULL;
    Tokenizer *t = tokenizer_new("gpt2");
    int32_t eot = json_id(json_object_get(encoder, GPT2_EOT));
    if (eot >= 0) CHECK(tokenizer_add_token(t, eot, GPT2_EOT, strlen(GPT2_EOT), true));
    t->bos = t->eos = eot;
    ByteLevel b;
    bytelevel_init(&b);
    bool ok = vocab_add(t, &b, encoder, encoder_path, err, errlen) &&
              ids_dense(t, encoder_path, err, errlen) &&
              gpt2_merges_add(t, &b, merges, bpe_path, err, errlen) &&
              tokenizer_finish(t, PRETOKENIZE_GPT2, encoder_path, err, errlen);
    free(b.buf), free(merges);
    if (!ok) tokenizer_free(t);
    return ok ? t : NULL;
}

// The GPT-2 file beside path (`name`); false naming both when it is missing.
static bool gpt2_partner(const char *path, const char *name, char *out, char *err,
                         size_t errlen) {
    tokenizer_sibling_path(path, name, out, PATH_MAX);
    if (access(out, R_OK) == 0) return true;
    return error_set(err, errlen, "tokenizer %s: a GPT-2 tokenizer needs %s beside it", path,
                     name);
}

Tokenizer *tokenizer_load_json(const char *path, const char *text, size_t len, char *err,
                               size_t errlen) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return json_fail(path, &jerr, err, errlen), NULL;
    Tokenizer *t = NULL;
    char bpe_path[PATH_MAX];
    if (json_is_object(json_object_get(root, "model")))  // GPT-2 has a token "model"
        t = load_huggingface(root, path, err, errlen);
    else if (!json_is_integer(json_object_iter_value(json_object_iter(root))))
        error_set(err, errlen, "tokenizer %s: neither a tokenizer.json nor an encoder.json", path);
    else if (gpt2_partner(path, "vocab.bpe", bpe_path, err, errlen))
        t = load_gpt2(root, path, bpe_path, err, errlen);
    json_decref(root);
    return t;
}

Tokenizer *tokenizer_load_gpt2_merges(const char *path, char *err, size_t errlen) {
    char encoder_path[PATH_MAX];
    if (!gpt2_partner(path, "encoder.json", encoder_path, err, errlen)) return NULL;
    json_error_t jerr;
    json_t *encoder = json_load_file(encoder_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!encoder) return json_fail(encoder_path, &jerr, err, errlen), NULL;
    Tokenizer *t = load_gpt2(encoder, encoder_path, path, err, errlen);
    json_decref(encoder);
    return t;
}
