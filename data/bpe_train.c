#include "data/bpe_train.h"

#include <omp.h>
#include <stdlib.h>
#include <time.h>

#include "core/errors.h"
#include "data/dataset.h"
#include "data/heap.h"
#include "data/pretokenize.h"

#define USAGE TOKENIZER_TRAIN_USAGE

// Documents are cut into chunks of about this many bytes so that one long document still
// spreads over the threads; the size is fixed so the chunks never depend on the thread count.
#define CHUNK_BYTES (256 * 1024)

// ---- Byte strings -> int64 values: open addressing with linear probing ----
// Counts pieces (value = frequency) and looks up token bytes (value = rank + 1); a value of 0
// marks an empty slot.

typedef struct {
    uint64_t hash;
    int64_t value;
    size_t offset, len;  // the key is pool[offset, offset + len)
} BytesSlot;

typedef struct {
    BytesSlot *slots;
    size_t cap, n;  // cap is a power of two
    char *pool;
    size_t pool_len, pool_cap;
} BytesTable;

static uint64_t bytes_hash(const char *s, size_t len) {  // FNV-1a
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static BytesSlot *bytes_table_slot(const BytesTable *t, const char *s, size_t len, uint64_t h) {
    for (size_t i = h & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        BytesSlot *slot = &t->slots[i];
        if (slot->value == 0) return slot;
        if (slot->hash == h && slot->len == len && memcmp(t->pool + slot->offset, s, len) == 0)
            return slot;
    }
}

static void bytes_table_grow(BytesTable *t) {
    BytesTable bigger = *t;
    bigger.cap = t->cap ? 2 * t->cap : 1024;
    bigger.slots = xcalloc(bigger.cap, sizeof(BytesSlot));
    for (size_t i = 0; i < t->cap; i++) {
        const BytesSlot *old = &t->slots[i];
        if (old->value == 0) continue;
        for (size_t j = old->hash & (bigger.cap - 1);; j = (j + 1) & (bigger.cap - 1))
            if (bigger.slots[j].value == 0) {
                bigger.slots[j] = *old;
                break;
            }
    }
    free(t->slots);
    *t = bigger;
}

static void bytes_table_add(BytesTable *t, const char *s, size_t len, int64_t value) {
    if (2 * (t->n + 1) > t->cap) bytes_table_grow(t);
    uint64_t h = bytes_hash(s, len);
    BytesSlot *slot = bytes_table_slot(t, s, len, h);
    if (slot->value == 0) {
        t->pool = xgrow(t->pool, &t->pool_cap, t->pool_len + len, 1);
        memcpy(t->pool + t->pool_len, s, len);
        *slot = (BytesSlot){.hash = h, .offset = t->pool_len, .len = len};
        t->pool_len += len;
        t->n++;
    }
    slot->value += value;
}

static int64_t bytes_table_find(const BytesTable *t, const char *s, size_t len) {
    return t->cap ? bytes_table_slot(t, s, len, bytes_hash(s, len))->value : 0;
}

static void bytes_table_free(BytesTable *t) {
    free(t->slots), free(t->pool);
    *t = (BytesTable){0};
}

// ---- Counting pieces ----

// A cut at p is invisible to the pre-tokenizer when text[p - 1] is '\n' and text[p] is
// printable ASCII: no alternative of the cl100k regex matches a newline followed by a
// non-space, the regex has no lookbehind, and both bytes are whole UTF-8 characters. So the
// chunks yield exactly the pieces of their whole document.
static size_t chunk_cut(const char *text, size_t from, size_t len) {
    for (size_t p = from; p < len; p++)
        if (text[p - 1] == '\n' && text[p] > ' ' && text[p] < 0x7f) return p;
    return len;
}

static BpeDocument *chunks_split(const BpeTrainInput *in, size_t *n_chunks) {
    BpeDocument *chunks = NULL;
    size_t n = 0, cap = 0;
    for (size_t d = 0; d < in->n_docs; d++) {
        const char *text = in->docs[d].text;
        size_t len = in->docs[d].len;
        for (size_t at = 0; at < len;) {
            size_t cut = len - at > CHUNK_BYTES ? chunk_cut(text, at + CHUNK_BYTES, len) : len;
            chunks = xgrow(chunks, &cap, n + 1, sizeof(BpeDocument));
            chunks[n++] = (BpeDocument){text + at, cut - at};
            at = cut;
        }
    }
    *n_chunks = n;
    return chunks;
}

static void piece_count(const char *piece, size_t len, void *table) {
    bytes_table_add(table, piece, len, 1);
}

// Per-thread tables summed into one: addition commutes, so the totals are thread-independent.
static BytesTable pieces_count(const BpeTrainInput *in, int threads) {
    char err[256];
    Pretokenizer *pre;
    CHECK(pretokenizer_try_create(&pre, PRETOKENIZE_CL100K, "the cl100k pattern", err,
                                  sizeof(err)));
    size_t n_chunks;
    BpeDocument *chunks = chunks_split(in, &n_chunks);
    BytesTable *local = xcalloc((size_t)threads, sizeof(BytesTable));
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (size_t i = 0; i < n_chunks; i++)
        pretokenizer_split(pre, chunks[i].text, chunks[i].len, piece_count,
                           &local[omp_get_thread_num()]);
    BytesTable total = {0};
    for (int t = 0; t < threads; t++) {
        for (size_t i = 0; i < local[t].cap; i++) {
            const BytesSlot *s = &local[t].slots[i];
            if (s->value) bytes_table_add(&total, local[t].pool + s->offset, s->len, s->value);
        }
        bytes_table_free(&local[t]);
    }
    free(local), free(chunks);
    pretokenizer_free(pre);
    return total;
}

// ---- Words: the distinct pieces as token sequences, shrinking as merges apply ----

typedef struct {
    int32_t n;
    int32_t *tokens;  // word w is tokens[offset[w], offset[w] + len[w])
    size_t *offset, *len;
    int64_t *count;   // (n) how often the piece occurs
} Words;

typedef struct {
    const char *bytes;
    size_t len;
    int64_t count;
} PieceRef;

static int piece_ref_compare(const void *pa, const void *pb) {
    const PieceRef *a = pa, *b = pb;
    int c = memcmp(a->bytes, b->bytes, a->len < b->len ? a->len : b->len);
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

// Sorted by bytes so that word ids, and everything built on them, are the same on every run.
static Words words_build(const BytesTable *pieces) {
    CHECK(pieces->n < INT32_MAX);
    PieceRef *refs = xmalloc(pieces->n * sizeof(PieceRef));
    size_t n = 0;
    for (size_t i = 0; i < pieces->cap; i++) {
        const BytesSlot *s = &pieces->slots[i];
        if (s->value) refs[n++] = (PieceRef){pieces->pool + s->offset, s->len, s->value};
    }
    qsort(refs, n, sizeof(PieceRef), piece_ref_compare);
    Words w = {.n = (int32_t)n,
               .tokens = xmalloc(pieces->pool_len * sizeof(int32_t)),
               .offset = xmalloc(n * sizeof(size_t)),
               .len = xmalloc(n * sizeof(size_t)),
               .count = xmalloc(n * sizeof(int64_t))};
    for (size_t i = 0, at = 0; i < n; at += refs[i].len, i++) {
        w.offset[i] = at, w.len[i] = refs[i].len, w.count[i] = refs[i].count;
        for (size_t k = 0; k < refs[i].len; k++) w.tokens[at + k] = (unsigned char)refs[i].bytes[k];
    }
    free(refs);
    return w;
}

static void words_free(Words *w) {
    free(w->tokens), free(w->offset), free(w->len), free(w->count);
}

// ---- Pairs: counts, the words each occurs in, and a max-heap with lazy invalidation ----

typedef struct {
    uint64_t key;   // left << 32 | right, so comparing keys compares (left, right)
    int64_t count;  // occurrences over all words, weighted by word count
    int32_t *words; // the words that hold the pair, plus some that held it once (stale)
    size_t n_words, cap_words;
} Pair;

typedef struct {
    int64_t count;
    uint64_t key;
} HeapEntry;

typedef struct {
    Pair *pairs;
    size_t n, cap;
    int64_t *slots;  // index into pairs, -1 when empty; slot_cap is a power of two
    size_t slot_cap;
    HeapEntry *heap;
    size_t heap_n, heap_cap;
} Pairs;

static uint64_t pair_key(int32_t left, int32_t right) {
    return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

static size_t pair_slot(const Pairs *p, uint64_t key) {
    uint64_t h = key;  // splitmix64's finalizer: every key bit reaches the low bits
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    for (size_t i = h & (p->slot_cap - 1);; i = (i + 1) & (p->slot_cap - 1))
        if (p->slots[i] < 0 || p->pairs[p->slots[i]].key == key) return i;
}

static void pairs_grow_slots(Pairs *p) {
    free(p->slots);
    p->slot_cap = p->slot_cap ? 2 * p->slot_cap : 4096;
    p->slots = xmalloc(p->slot_cap * sizeof(int64_t));
    for (size_t i = 0; i < p->slot_cap; i++) p->slots[i] = -1;
    for (size_t i = 0; i < p->n; i++) p->slots[pair_slot(p, p->pairs[i].key)] = (int64_t)i;
}

static Pair *pair_find(const Pairs *p, uint64_t key) {
    int64_t i = p->slots[pair_slot(p, key)];
    return i < 0 ? NULL : &p->pairs[i];
}

// The pair, created with count 0 if new; creation may move every Pair.
static Pair *pair_get(Pairs *p, uint64_t key) {
    if (2 * (p->n + 1) > p->slot_cap) pairs_grow_slots(p);
    size_t slot = pair_slot(p, key);
    if (p->slots[slot] < 0) {
        p->pairs = xgrow(p->pairs, &p->cap, p->n + 1, sizeof(Pair));
        p->pairs[p->n] = (Pair){.key = key};
        p->slots[slot] = (int64_t)p->n++;
    }
    return &p->pairs[p->slots[slot]];
}

static bool heap_before(HeapEntry a, HeapEntry b) {
    return a.count > b.count || (a.count == b.count && a.key < b.key);
}

HEAP_DEFINE(counts, HeapEntry, heap_before)

static void heap_push(Pairs *p, HeapEntry e) {
    p->heap = xgrow(p->heap, &p->heap_cap, p->heap_n + 1, sizeof(HeapEntry));
    counts_push(p->heap, &p->heap_n, e);
}

// The most frequent pair, or NULL when none is left. A pair's count grows only in the merge
// that creates it (it needs the newer of its two tokens), when it is pushed; afterwards it can
// only fall. So every entry's count is at least the pair's, and an entry that still matches
// its pair's count is the true maximum; stale ones are pushed back with their current count.
static Pair *pairs_pop_best(Pairs *p) {
    while (p->heap_n > 0) {
        HeapEntry e = counts_pop(p->heap, &p->heap_n);
        Pair *pair = pair_find(p, e.key);
        if (pair->count == e.count) return pair;
        if (pair->count > 0) heap_push(p, (HeapEntry){pair->count, e.key});
    }
    return NULL;
}

static void pairs_free(Pairs *p) {
    for (size_t i = 0; i < p->n; i++) free(p->pairs[i].words);
    free(p->pairs), free(p->slots), free(p->heap);
}

// ---- Merging ----

static void pairs_add_word(Pairs *p, const int32_t *t, size_t len, int64_t delta) {
    for (size_t i = 0; i + 1 < len; i++) pair_get(p, pair_key(t[i], t[i + 1]))->count += delta;
}

// Records word w under its pairs that contain token `with` (every pair when with < 0). A word
// is listed once per pair: its own pairs are recorded together, so a repeat is the last entry.
static void pairs_index_word(Pairs *p, const int32_t *t, size_t len, int32_t w, int32_t with) {
    for (size_t i = 0; i + 1 < len; i++) {
        if (with >= 0 && t[i] != with && t[i + 1] != with) continue;
        Pair *pair = pair_get(p, pair_key(t[i], t[i + 1]));
        if (pair->n_words > 0 && pair->words[pair->n_words - 1] == w) continue;
        pair->words =
            xgrow(pair->words, &pair->cap_words, pair->n_words + 1, sizeof(int32_t));
        pair->words[pair->n_words++] = w;
    }
}

static Pairs pairs_build(const Words *words) {
    Pairs p = {0};
    pairs_grow_slots(&p);
    for (int32_t w = 0; w < words->n; w++) {
        const int32_t *t = words->tokens + words->offset[w];
        pairs_add_word(&p, t, words->len[w], words->count[w]);
        pairs_index_word(&p, t, words->len[w], w, -1);
    }
    for (size_t i = 0; i < p.n; i++) heap_push(&p, (HeapEntry){p.pairs[i].count, p.pairs[i].key});
    return p;
}

// Replaces each (a, b) in t, left to right, by z (so "a a a" under (a, a) becomes "z a", as
// every BPE trainer does); returns the new length.
static size_t tokens_merge(int32_t *t, size_t len, int32_t a, int32_t b, int32_t z) {
    size_t j = 0;
    for (size_t i = 0; i < len;) {
        if (i + 1 < len && t[i] == a && t[i + 1] == b) t[j++] = z, i += 2;
        else t[j++] = t[i++];
    }
    return j;
}

static bool tokens_have(const int32_t *t, size_t len, int32_t a, int32_t b) {
    for (size_t i = 0; i + 1 < len; i++)
        if (t[i] == a && t[i + 1] == b) return true;
    return false;
}

// Takes word w's pairs out of the counts, merges, and puts the new pairs back: words are
// short, so recounting the whole word is as cheap as patching the neighbours of each merge.
static void word_merge(Words *words, Pairs *p, int32_t w, int32_t a, int32_t b, int32_t z) {
    int32_t *t = words->tokens + words->offset[w];
    size_t len = words->len[w];
    if (!tokens_have(t, len, a, b)) return;  // a stale index entry
    pairs_add_word(p, t, len, -words->count[w]);
    len = words->len[w] = tokens_merge(t, len, a, b, z);
    pairs_add_word(p, t, len, words->count[w]);
    pairs_index_word(p, t, len, w, z);
}

// Merges pair (a, b) into token z in every word. The pairs this creates all contain z and are
// appended after the existing ones, so they are the ones to push on the heap.
static void pairs_merge(Pairs *p, Words *words, uint64_t key, int32_t z) {
    Pair *pair = pair_find(p, key);
    int32_t *list = pair->words, a = (int32_t)(key >> 32), b = (int32_t)(uint32_t)key;
    size_t n_list = pair->n_words, first_new = p->n;
    *pair = (Pair){.key = key, .count = pair->count};
    for (size_t i = 0; i < n_list; i++) word_merge(words, p, list[i], a, b, z);
    free(list);
    CHECK(pair_find(p, key)->count == 0);
    for (size_t i = first_new; i < p->n; i++)
        if (p->pairs[i].count > 0) heap_push(p, (HeapEntry){p->pairs[i].count, p->pairs[i].key});
}

// ---- The vocabulary ----

typedef struct {
    BpeVocab v;
    size_t cap_tokens, cap_bytes;
    BytesTable ranks;  // token bytes -> rank + 1
} VocabBuilder;

static const char *vocab_token(const BpeVocab *v, int32_t r, size_t *len) {
    *len = (size_t)(v->offsets[r + 1] - v->offsets[r]);
    return (const char *)v->bytes + v->offsets[r];
}

static void vocab_append(VocabBuilder *b, const char *s, size_t len) {
    BpeVocab *v = &b->v;
    size_t end = (size_t)v->offsets[v->n_tokens];
    v->offsets = xgrow(v->offsets, &b->cap_tokens, (size_t)v->n_tokens + 2, sizeof(int64_t));
    v->bytes = xgrow(v->bytes, &b->cap_bytes, end + len, 1);
    memcpy(v->bytes + end, s, len);
    v->offsets[v->n_tokens + 1] = (int64_t)(end + len);
    bytes_table_add(&b->ranks, s, len, v->n_tokens + 1);
    v->n_tokens++;
}

static VocabBuilder vocab_start(void) {
    VocabBuilder b = {0};
    b.v.offsets = xgrow(NULL, &b.cap_tokens, 1, sizeof(int64_t));
    b.v.offsets[0] = 0;
    for (int c = 0; c < 256; c++) vocab_append(&b, &(char){(char)c}, 1);
    return b;
}

// Adds the concatenation of tokens a and b; false when that byte string is already a token.
static bool vocab_add_merge(VocabBuilder *vb, int32_t a, int32_t b) {
    size_t la, lb;
    const char *sa = vocab_token(&vb->v, a, &la), *sb = vocab_token(&vb->v, b, &lb);
    char *s = xmalloc(la + lb);  // a copy: appending may move the vocabulary's bytes
    memcpy(s, sa, la);
    memcpy(s + la, sb, lb);
    bool fresh = bytes_table_find(&vb->ranks, s, la + lb) == 0;
    if (fresh) vocab_append(vb, s, la + lb);
    free(s);
    return fresh;
}

static void merges_run(Words *words, VocabBuilder *vb, int32_t n_ranks, BpeTrainStats *stats) {
    Pairs p = pairs_build(words);
    while (vb->v.n_tokens < n_ranks) {
        Pair *best = pairs_pop_best(&p);
        if (!best || best->count < 2) {
            stats->stopped_early = true;
            break;
        }
        uint64_t key = best->key;
        if (!vocab_add_merge(vb, (int32_t)(key >> 32), (int32_t)(uint32_t)key)) {
            stats->duplicates++;  // popped and never pushed again: the pair stays unmerged
            continue;
        }
        pairs_merge(&p, words, key, vb->v.n_tokens - 1);
        stats->merges++;
    }
    pairs_free(&p);
}

BpeVocab bpe_train(const BpeTrainInput *in, int64_t vocab_size, int threads,
                   BpeTrainStats *stats) {
    CHECK(vocab_size >= BPE_TRAIN_MIN_VOCAB && vocab_size <= BPE_TRAIN_MAX_VOCAB && threads > 0);
    *stats = (BpeTrainStats){.documents = (int64_t)in->n_docs};
    for (size_t d = 0; d < in->n_docs; d++) stats->bytes += (int64_t)in->docs[d].len;
    BytesTable pieces = pieces_count(in, threads);
    stats->pieces = (int64_t)pieces.n;
    Words words = words_build(&pieces);
    bytes_table_free(&pieces);
    VocabBuilder b = vocab_start();
    merges_run(&words, &b, (int32_t)(vocab_size - BPE_TRAIN_SPECIALS), stats);
    words_free(&words);
    bytes_table_free(&b.ranks);
    return b.v;
}

void bpe_vocab_free(BpeVocab *v) {
    free(v->offsets), free(v->bytes);
    *v = (BpeVocab){0};
}

// ---- The rank file ----

// Standard base64 (RFC 4648) with padding; out holds 4 * ceil(len / 3) + 1 bytes.
static void base64_encode(const uint8_t *s, size_t len, char *out) {
    static const char ALPHABET[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t j = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16;
        if (i + 1 < len) v |= (uint32_t)s[i + 1] << 8;
        if (i + 2 < len) v |= s[i + 2];
        out[j++] = ALPHABET[v >> 18];
        out[j++] = ALPHABET[(v >> 12) & 63];
        out[j++] = i + 1 < len ? ALPHABET[(v >> 6) & 63] : '=';
        out[j++] = i + 2 < len ? ALPHABET[v & 63] : '=';
    }
    out[j] = '\0';
}

void bpe_vocab_write(const BpeVocab *v, const char *path) {
    size_t n = strlen(path) + 5;
    char *tmp = xmalloc(n), *line = NULL;
    snprintf(tmp, n, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) die_user("cannot write tokenizer file %s: %s", tmp, strerror(errno));
    size_t cap = 0;
    for (int32_t r = 0; r < v->n_tokens; r++) {
        size_t len;
        const char *s = vocab_token(v, r, &len);
        line = xgrow(line, &cap, 4 * (len / 3 + 1) + 1, 1);
        base64_encode((const uint8_t *)s, len, line);
        fprintf(f, "%s %d\n", line, r);
    }
    bool failed = ferror(f) != 0;
    if (fclose(f) != 0 || failed)
        die_user("cannot write tokenizer file %s: %s", tmp, strerror(errno));
    if (rename(tmp, path) != 0) die_user("cannot rename %s to %s: %s", tmp, path, strerror(errno));
    free(line), free(tmp);
}

// ---- The command ----

typedef struct {
    int64_t vocab_size;
    int threads;
    const char *out;
    char **files;
    int n_files;
} TrainArgs;

static int64_t arg_int(const char *flag, const char *s, int64_t lo, int64_t hi) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        die_user("tokenizer train: %s %s must be an integer in [%lld, %lld]", flag, s,
                 (long long)lo, (long long)hi);
    return v;
}

static TrainArgs args_parse(int argc, char **argv) {
    help_exit_if_asked(argc, argv, USAGE);
    TrainArgs a = {.threads = omp_get_max_threads(),
                   .files = xmalloc((size_t)argc * sizeof(char *))};
    for (int i = 1; i < argc; i++) {
        bool has_value = i + 1 < argc;
        if (strcmp(argv[i], "--vocab-size") == 0 && has_value)
            a.vocab_size =
                arg_int("--vocab-size", argv[++i], BPE_TRAIN_MIN_VOCAB, BPE_TRAIN_MAX_VOCAB);
        else if (strcmp(argv[i], "--threads") == 0 && has_value)
            a.threads = (int)arg_int("--threads", argv[++i], 1, 1024);
        else if (strcmp(argv[i], "--out") == 0 && has_value) a.out = argv[++i];
        else if (argv[i][0] == '-') die_user("tokenizer train: bad option %s; " USAGE, argv[i]);
        else a.files[a.n_files++] = argv[i];
    }
    if (a.vocab_size == 0) die_user("tokenizer train: --vocab-size is required; " USAGE);
    if (!a.out) die_user("tokenizer train: --out is required; " USAGE);
    if (a.n_files == 0) die_user("tokenizer train: no input files; " USAGE);
    return a;
}

// Documents kept in one buffer: text[offsets[i], offsets[i + 1]) is document i.
typedef struct {
    char *text;
    size_t len, cap;
    size_t *offsets;
    size_t n, cap_offsets;
} DocumentStore;

static void document_keep(const char *text, size_t len, const DocParts *parts,
                          uint64_t bytes_read, void *ctx) {
    (void)bytes_read;  // a supervised example's text is text to learn merges from
    if (parts && parts->conversation)
        die_user("%s: titan tokenizer train reads text: a conversation (\"messages\") is "
                 "rendered by a chat template, which a tokenizer being trained has not",
                 parts->where);
    DocumentStore *s = ctx;
    s->text = xgrow(s->text, &s->cap, s->len + len + 1, 1);  // never NULL, even if empty
    memcpy(s->text + s->len, text, len);
    s->len += len;
    s->offsets = xgrow(s->offsets, &s->cap_offsets, s->n + 2, sizeof(size_t));
    s->offsets[0] = 0;
    s->offsets[++s->n] = s->len;
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tokenizer_train_main(int argc, char **argv) {
    TrainArgs a = args_parse(argc, argv);
    double start = seconds_now();
    DocumentStore store = {0};
    for (int i = 0; i < a.n_files; i++) dataset_for_each_document(a.files[i], document_keep, &store);
    BpeDocument *docs = xmalloc(store.n * sizeof(BpeDocument));
    for (size_t i = 0; i < store.n; i++)
        docs[i] = (BpeDocument){store.text + store.offsets[i],
                                store.offsets[i + 1] - store.offsets[i]};
    BpeTrainStats st;
    BpeVocab v = bpe_train(&(BpeTrainInput){docs, store.n}, a.vocab_size, a.threads, &st);
    bpe_vocab_write(&v, a.out);
    char skipped[64] = "";
    if (st.duplicates)
        snprintf(skipped, sizeof(skipped), ", %d merges skipped as duplicates", st.duplicates);
    log_info("tokenizer train: %lld documents, %lld bytes, %lld distinct pieces, %d merges "
             "(%d ranks + BOS/EOS)%s%s, %.2f s, wrote %s",
             (long long)st.documents, (long long)st.bytes, (long long)st.pieces, st.merges,
             v.n_tokens, skipped, st.stopped_early ? ", stopped early: no pair occurs twice" : "",
             seconds_now() - start, a.out);
    bpe_vocab_free(&v);
    free(docs), free(store.text), free(store.offsets), free(a.files);
    return 0;
}
