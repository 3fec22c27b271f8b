// The vocabulary tables every loader fills (data/tokenizer_impl.h) and the accessors.
// Encoding lives in data/tokenizer_encode.c, the file formats in data/tokenizer_load.c.
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "data/tokenizer_impl.h"

#define TABLE_MIN_SLOTS 1024

// Multiply-xorshift rounds over 8-byte words (splitmix64's constants): pieces are a few bytes,
// so one or two rounds hash one, and the finaliser spreads it over the low bits we index by.
uint64_t tokenizer_hash(const char *s, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n, w;
    for (; n >= 8; s += 8, n -= 8) {
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0x94d049bb133111ebull;
    return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t key) {
    key = (key ^ (key >> 30)) * 0xbf58476d1ce4e5b9ull;
    key = (key ^ (key >> 27)) * 0x94d049bb133111ebull;
    return key ^ (key >> 31);
}

// The slot of the token with these bytes, or the empty slot where it would go.
static size_t bytetable_slot(const Tokenizer *t, const char *s, size_t n, uint64_t h) {
    const ByteTable *b = &t->tokens;
    size_t i = h & b->mask;
    for (const ByteSlot *at; (at = &b->slots[i])->id >= 0; i = (i + 1) & b->mask)
        if (at->tag == (uint32_t)h && at->len == n && memcmp(t->blob + at->start, s, n) == 0)
            break;
    return i;
}

static void bytetable_place(Tokenizer *t, int32_t id) {
    const char *s = t->blob + t->start[id];
    uint64_t h = tokenizer_hash(s, (size_t)t->len[id]);
    size_t i = bytetable_slot(t, s, (size_t)t->len[id], h);
    t->tokens.slots[i] = (ByteSlot){(uint32_t)h, (uint32_t)t->start[id], (uint32_t)t->len[id], id};
    t->tokens.count++;
}

// Rehashes into twice the slots, keeping the load factor under 1/2 so probes stay short.
static void bytetable_grow(Tokenizer *t) {
    ByteTable old = t->tokens;
    size_t slots = old.slots ? 2 * (old.mask + 1) : TABLE_MIN_SLOTS;
    t->tokens = (ByteTable){xmalloc(slots * sizeof(ByteSlot)), slots - 1, 0};
    for (size_t i = 0; i < slots; i++) t->tokens.slots[i].id = -1;
    for (size_t i = 0; old.slots && i <= old.mask; i++)
        if (old.slots[i].id >= 0) bytetable_place(t, old.slots[i].id);
    free(old.slots);
}

int32_t tokenizer_lookup_hashed(const Tokenizer *t, const char *s, size_t n, uint64_t h) {
    return t->tokens.slots[bytetable_slot(t, s, n, h)].id;
}

int32_t tokenizer_lookup(const Tokenizer *t, const char *s, size_t n) {
    return tokenizer_lookup_hashed(t, s, n, tokenizer_hash(s, n));
}

int32_t tokenizer_scan(const Tokenizer *t, const char *s, size_t n) {
    for (int32_t id = 0; id < t->n_ids; id++)
        if (t->len[id] == (int32_t)n && memcmp(t->blob + t->start[id], s, n) == 0) return id;
    return -1;
}

static size_t pairtable_slot(const PairTable *p, uint64_t key) {
    size_t i = hash_pair(key) & p->mask;
    while (p->slots[i].key != UINT64_MAX && p->slots[i].key != key) i = (i + 1) & p->mask;
    return i;
}

static void pairtable_grow(PairTable *p) {
    PairTable old = *p;
    size_t slots = old.slots ? 2 * (old.mask + 1) : TABLE_MIN_SLOTS;
    *p = (PairTable){xmalloc(slots * sizeof(PairSlot)), slots - 1, old.count};
    for (size_t i = 0; i < slots; i++) p->slots[i].key = UINT64_MAX;
    for (size_t i = 0; old.slots && i <= old.mask; i++)
        if (old.slots[i].key != UINT64_MAX)
            p->slots[pairtable_slot(p, old.slots[i].key)] = old.slots[i];
    free(old.slots);
}

static uint64_t pair_key(int32_t left, int32_t right) {
    return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

int32_t tokenizer_add_merge(Tokenizer *t, int32_t left, int32_t right, int32_t rank,
                            int32_t merged) {
    PairTable *p = &t->pairs;
    if (2 * (p->count + 1) > p->mask + 1) pairtable_grow(p);
    uint64_t key = pair_key(left, right);
    size_t i = pairtable_slot(p, key);
    if (p->slots[i].key == key) return p->slots[i].rank;
    p->slots[i] = (PairSlot){key, rank, merged};
    p->count++;
    return -1;
}

bool tokenizer_pair_find(const Tokenizer *t, int32_t left, int32_t right, int32_t *rank,
                         int32_t *merged) {
    const PairTable *p = &t->pairs;
    if (!p->slots) return false;
    const PairSlot *at = &p->slots[pairtable_slot(p, pair_key(left, right))];
    if (at->key == UINT64_MAX) return false;
    *rank = at->rank, *merged = at->merged;
    return true;
}

void tokenizer_merges_from_ranks(Tokenizer *t) {
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (t->len[id] < 2) continue;  // a single byte, or an id no token has
        const char *s = t->blob + t->start[id];
        size_t n = (size_t)t->len[id];
        if (tokenizer_lookup(t, s, n) != id) continue;  // special
        for (size_t cut = 1; cut < n; cut++) {
            int32_t left = tokenizer_lookup(t, s, cut);
            int32_t right = tokenizer_lookup(t, s + cut, n - cut);
            // distinct tokens' splits are distinct pairs: bytes name one token
            if (left >= 0 && right >= 0) CHECK(tokenizer_add_merge(t, left, right, id, id) < 0);
        }
    }
}

Tokenizer *tokenizer_new(const char *format) {
    static _Atomic uint64_t made;
    Tokenizer *t = xcalloc(1, sizeof(Tokenizer));
    t->format = format;
    t->serial = ++made;
    t->bos = t->eos = -1;
    bytetable_grow(t);
    return t;
}

static void ids_reserve(Tokenizer *t, int32_t id) {
    if (id < t->id_cap) return;
    int32_t cap = t->id_cap ? t->id_cap : 1024;
    while (cap <= id) cap *= 2;
    t->start = realloc(t->start, (size_t)cap * sizeof(size_t));
    t->len = realloc(t->len, (size_t)cap * sizeof(int32_t));
    CHECK(t->start && t->len);
    for (int32_t i = t->id_cap; i < cap; i++) t->len[i] = -1;
    t->id_cap = cap;
}

static void blob_append(Tokenizer *t, const char *s, size_t n) {
    if (t->blob_len + n > t->blob_cap) {
        t->blob_cap = 2 * (t->blob_len + n) + 4096;
        t->blob = realloc(t->blob, t->blob_cap);
        CHECK(t->blob);
    }
    memcpy(t->blob + t->blob_len, s, n);
    t->blob_len += n;
}

bool tokenizer_add_token(Tokenizer *t, int32_t id, const char *s, size_t n, bool special) {
    CHECK(id >= 0 && id < TOKENIZER_MAX_IDS && n > 0 && n <= INT32_MAX &&
          t->blob_len + n <= UINT32_MAX);
    ids_reserve(t, id);
    if (t->len[id] >= 0 || (!special && tokenizer_lookup(t, s, n) >= 0)) return false;
    t->start[id] = t->blob_len;
    t->len[id] = (int32_t)n;
    blob_append(t, s, n);
    if (id >= t->n_ids) t->n_ids = id + 1;
    if (special) {
        tokenizer_mark_added(t, id);
        return true;
    }
    if (2 * (t->tokens.count + 1) > t->tokens.mask + 1) bytetable_grow(t);
    bytetable_place(t, id);
    return true;
}

bool tokenizer_finish(Tokenizer *t, const char *pattern, const char *path, char *err,
                      size_t errlen) {
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_ids[b] = tokenizer_lookup(t, &c, 1);
        if (t->byte_ids[b] < 0)
            return error_set(err, errlen, "tokenizer %s has no token for the byte 0x%02x", path,
                             b);
    }
    if (!pattern) return true;
    char why[256], name[PATH_MAX + 16];
    snprintf(name, sizeof name, "tokenizer %s", path);
    if (!pretokenizer_try_create(&t->pretok, pattern, name, why, sizeof why))
        return error_set(err, errlen, "tokenizer %s: %s", path, why);
    return true;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    pretokenizer_free(t->pretok);
    free(t->tokens.slots), free(t->pairs.slots);
    free(t->blob), free(t->start), free(t->len);
    free(t->added), free(t->chat_error);
    jinja_free(t->chat);
    json_decref(t->chat_specials);
    free(t);
}

void tokenizer_mark_added(Tokenizer *t, int32_t id) {
    t->added = xgrow(t->added, &t->added_cap, t->n_added + 1, sizeof(int32_t));
    t->added[t->n_added++] = id;
}

const Jinja *tokenizer_chat_template(const Tokenizer *t, const json_t **specials, char *err,
                                     size_t errlen) {
    if (!t->chat) snprintf(err, errlen, "%s", t->chat_error ? t->chat_error
                                                            : "the tokenizer has no chat template");
    *specials = t->chat_specials;
    return t->chat;
}

int tokenizer_vocab_size(const Tokenizer *t) { return t->n_ids; }
int tokenizer_bos_id(const Tokenizer *t) { return t->bos; }
int tokenizer_eos_id(const Tokenizer *t) { return t->eos; }
const char *tokenizer_format(const Tokenizer *t) { return t->format; }

const char *tokenizer_token_bytes(const Tokenizer *t, int32_t id, size_t *len) {
    CHECK(id >= 0 && id < t->n_ids);
    if (t->len[id] < 0) {  // a hole in the vocabulary
        *len = 0;
        return "";
    }
    *len = (size_t)t->len[id];
    return t->blob + t->start[id];
}

char *tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n, size_t *len) {
    size_t total = 0, one;
    for (size_t i = 0; i < n; i++) tokenizer_token_bytes(t, ids[i], &one), total += one;
    char *out = xmalloc(total + 1);
    *len = total;
    for (size_t i = 0, at = 0; i < n; i++, at += one) {
        const char *bytes = tokenizer_token_bytes(t, ids[i], &one);
        memcpy(out + at, bytes, one);
    }
    out[total] = '\0';
    return out;
}
