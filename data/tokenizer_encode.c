// Encoding: pre-tokenize, then byte-pair merge each piece as tiktoken's byte_pair_merge does.
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "core/thread_exit.h"
#include "data/tokenizer_impl.h"

// One part of a piece being merged: its id, and the merge with the part after it (rank
// INT32_MAX when that pair never merges).
typedef struct {
    int32_t id, rank, merged;
} Part;

// Pieces are words, numbers of up to three digits or runs of punctuation or space, so nearly
// all fit here; a longer one (a long run of spaces) takes the heap, once per call.
#define LOCAL_PARTS 256

// The pieces that are not tokens themselves cost most (merging), and they repeat (inflected
// words, names), so each thread keeps the last merge result seen in each of MEMO_SLOTS slots,
// keyed by the tokenizer's serial and the piece (short pieces with few ids only).
#define MEMO_SLOTS 4096
#define MEMO_BYTES 22
#define MEMO_IDS 8

typedef struct {
    uint64_t serial;  // the tokenizer's; 0 for an empty slot
    uint8_t len, n_ids;
    char bytes[MEMO_BYTES];
    int32_t ids[MEMO_IDS];
} MemoSlot;

static _Thread_local MemoSlot *thread_memo;  // (MEMO_SLOTS), made on a thread's first use

typedef struct {
    const Tokenizer *t;
    int32_t **ids;
    size_t *cap, n;
    Part local[LOCAL_PARTS], *heap;
    size_t heap_cap;
} Encoder;

static void part_link(const Tokenizer *t, Part *p, const Part *next) {
    if (!next || !tokenizer_pair_find(t, p->id, next->id, &p->rank, &p->merged))
        p->rank = INT32_MAX;
}

// Repeatedly merges the adjacent pair of lowest rank (the leftmost on a tie) until no pair
// merges; O(n^2) in the piece length, as tiktoken's, which is cheap for pieces this short.
// Returns the number of parts left.
static size_t bpe_merge(const Tokenizer *t, const unsigned char *s, size_t n, Part *parts) {
    for (size_t i = 0; i < n; i++) parts[i].id = t->byte_ids[s[i]];
    for (size_t i = 0; i < n; i++) part_link(t, &parts[i], i + 1 < n ? &parts[i + 1] : NULL);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (parts[i].rank < parts[best].rank) best = i;
        if (parts[best].rank == INT32_MAX) break;
        parts[best].id = parts[best].merged;
        memmove(&parts[best + 1], &parts[best + 2], (n - best - 2) * sizeof(Part));
        n--;
        if (best > 0) part_link(t, &parts[best - 1], &parts[best]);
        part_link(t, &parts[best], best + 1 < n ? &parts[best + 1] : NULL);
    }
    return n;
}

static Part *encoder_parts(Encoder *e, size_t n) {
    if (n <= LOCAL_PARTS) return e->local;
    if (n > e->heap_cap) {
        free(e->heap);
        e->heap_cap = 2 * n;
        e->heap = xmalloc(e->heap_cap * sizeof(Part));
    }
    return e->heap;
}

static void encoder_reserve(Encoder *e, size_t more) {
    *e->ids = xgrow(*e->ids, e->cap, e->n + more, sizeof(int32_t));
}

static void encoder_push(Encoder *e, const int32_t *ids, size_t n) {
    encoder_reserve(e, n);
    memcpy(*e->ids + e->n, ids, n * sizeof(int32_t));
    e->n += n;
}

// The memo slot of this piece, or NULL for a piece too long to remember.
static MemoSlot *memo_slot(uint64_t hash, size_t len) {
    if (len > MEMO_BYTES) return NULL;
    if (!thread_memo) {
        thread_memo = xcalloc(MEMO_SLOTS, sizeof(MemoSlot));
        thread_exit_free(thread_memo, free);
    }
    return &thread_memo[(hash >> 32) & (MEMO_SLOTS - 1)];
}

static void encode_piece(const char *piece, size_t len, void *ctx) {
    Encoder *e = ctx;
    uint64_t hash = tokenizer_hash(piece, len);
    int32_t id = tokenizer_lookup_hashed(e->t, piece, len, hash);
    if (id >= 0) {  // a piece that is a token maps to it directly, as in tiktoken
        encoder_push(e, &id, 1);
        return;
    }
    MemoSlot *memo = memo_slot(hash, len);
    if (memo && memo->serial == e->t->serial && memo->len == len &&
        memcmp(memo->bytes, piece, len) == 0) {
        encoder_push(e, memo->ids, memo->n_ids);
        return;
    }
    Part *parts = encoder_parts(e, len);
    size_t n = bpe_merge(e->t, (const unsigned char *)piece, len, parts);
    encoder_reserve(e, n);
    for (size_t i = 0; i < n; i++) (*e->ids)[e->n + i] = parts[i].id;
    if (memo && n <= MEMO_IDS) {
        *memo = (MemoSlot){.serial = e->t->serial, .len = (uint8_t)len, .n_ids = (uint8_t)n};
        memcpy(memo->bytes, piece, len);
        memcpy(memo->ids, *e->ids + e->n, n * sizeof(int32_t));
    }
    e->n += n;
}

size_t tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int32_t **ids,
                        size_t *cap) {
    Encoder e = {.t = t, .ids = ids, .cap = cap};
    if (!t->pretok) {  // the bytes tokenizer: one token per byte
        encoder_reserve(&e, len);
        for (size_t i = 0; i < len; i++) (*ids)[i] = t->byte_ids[(unsigned char)text[i]];
        return len;
    }
    pretokenizer_split(t->pretok, text, len, encode_piece, &e);
    free(e.heap);
    return e.n;
}
