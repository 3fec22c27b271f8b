// Encoding: pre-tokenize, then byte-pair merge each piece as tiktoken's byte_pair_merge does.
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "core/thread_exit.h"
#include "data/heap.h"
#include "data/tokenizer_impl.h"

// One part of a piece being merged, a node of a doubly linked list over the piece's bytes
// (indices; -1 ends it). `merged` is the id its pair with the next part merges into, valid while
// `stamp` equals the stamp of the candidate that carries the pair's rank.
typedef struct {
    int32_t id, merged, prev, next;
    uint32_t stamp;
} Part;

// A candidate merge: the pair (part `at`, its next part) of this rank. It is stale (and
// skipped) once the part's stamp moved on: the part merged away or a neighbour changed.
typedef struct {
    int32_t rank, at;
    uint32_t stamp;
} Candidate;

// Pieces are words, numbers of up to three digits or runs of punctuation or space, so nearly
// all fit here; a longer one (a long run of spaces) takes malloc'd arrays, grown once per call.
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

// The merge state of one piece: its parts and a binary min-heap of candidates ordered by
// (rank, at). Each merge adds at most two candidates, so 3 * (parts) bound the heap.
typedef struct {
    const Tokenizer *t;
    Part *parts;
    Candidate *heap;
    size_t n_heap;
} Merge;

typedef struct {
    const Tokenizer *t;
    int32_t **ids;
    size_t *cap, n;
    Part local_parts[LOCAL_PARTS], *parts;
    Candidate local_heap[3 * LOCAL_PARTS], *heap;
    size_t parts_cap;  // malloc'd parts hold this many, heap 3x as many candidates
} Encoder;

static bool candidate_before(Candidate a, Candidate b) {
    return a.rank < b.rank || (a.rank == b.rank && a.at < b.at);
}

HEAP_DEFINE(candidates, Candidate, candidate_before)

// The pair of part `at` and its next changed: older candidates for it go stale, and a new one
// joins when the pair merges.
static void part_relink(Merge *m, int32_t at) {
    Part *p = &m->parts[at];
    int32_t rank;
    p->stamp++;
    if (p->next >= 0 && tokenizer_pair_find(m->t, p->id, m->parts[p->next].id, &rank, &p->merged))
        candidates_push(m->heap, &m->n_heap, (Candidate){rank, at, p->stamp});
}

// Repeatedly merges the adjacent pair of lowest rank (the leftmost on a tie) until no pair
// merges, as tiktoken's byte_pair_merge and Hugging Face's BPE do. Candidates are ordered by
// (rank, position of the left part), and parts keep the position of their first byte, so the
// heap's minimum is exactly the pair a rescan would pick: O(n log n) in the piece length
// instead of a rescan's O(n^2). Writes the ids left to ids (at most n); returns their number.
static size_t bpe_merge(Merge *m, const unsigned char *s, size_t n, int32_t *ids) {
    Part *parts = m->parts;
    for (size_t i = 0; i < n; i++)
        parts[i] = (Part){m->t->byte_ids[s[i]], -1, (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1,
                          0};
    m->n_heap = 0;
    for (size_t i = 0; i + 1 < n; i++) part_relink(m, (int32_t)i);
    while (m->n_heap > 0) {
        Candidate c = candidates_pop(m->heap, &m->n_heap);
        Part *p = &parts[c.at];
        if (p->stamp != c.stamp) continue;
        Part *gone = &parts[p->next];
        p->id = p->merged;
        p->next = gone->next;
        gone->stamp++;  // its own candidate is now stale
        if (p->next >= 0) parts[p->next].prev = c.at;
        part_relink(m, c.at);
        if (p->prev >= 0) part_relink(m, p->prev);
    }
    size_t count = 0;
    for (int32_t at = 0; at >= 0; at = parts[at].next) ids[count++] = parts[at].id;
    return count;
}

// The merge state for a piece of n bytes: the encoder's own arrays, or malloc'd ones grown once.
static Merge encoder_merge(Encoder *e, size_t n) {
    if (n <= LOCAL_PARTS) return (Merge){e->t, e->local_parts, e->local_heap, 0};
    if (n > e->parts_cap) {
        free(e->parts), free(e->heap);
        e->parts_cap = 2 * n;
        e->parts = xmalloc(e->parts_cap * sizeof(Part));
        e->heap = xmalloc(3 * e->parts_cap * sizeof(Candidate));
    }
    return (Merge){e->t, e->parts, e->heap, 0};
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

// Where to cut a piece longer than TOKENIZER_PIECE_MAX: at most that many bytes, ending on a
// UTF-8 character boundary (a valid piece's continuation bytes follow a lead within 3 bytes).
static size_t piece_chunk(const char *piece, size_t len) {
    if (len <= TOKENIZER_PIECE_MAX) return len;
    size_t cut = TOKENIZER_PIECE_MAX;
    for (int back = 0; back < 3 && ((unsigned char)piece[cut] & 0xc0) == 0x80; back++) cut--;
    return ((unsigned char)piece[cut] & 0xc0) == 0x80 ? TOKENIZER_PIECE_MAX : cut;
}

// Byte-pair merges one chunk of a piece, through the memo when the chunk is short.
static void encode_chunk(Encoder *e, const char *piece, size_t len) {
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
    Merge m = encoder_merge(e, len);
    encoder_reserve(e, len);
    size_t n = bpe_merge(&m, (const unsigned char *)piece, len, *e->ids + e->n);
    if (memo && n <= MEMO_IDS) {
        *memo = (MemoSlot){.serial = e->t->serial, .len = (uint8_t)len, .n_ids = (uint8_t)n};
        memcpy(memo->bytes, piece, len);
        memcpy(memo->ids, *e->ids + e->n, n * sizeof(int32_t));
    }
    e->n += n;
}

// A piece longer than TOKENIZER_PIECE_MAX is merged in chunks of at most that many bytes, so
// that one piece's working memory stays bounded (data/tokenizer.h).
static void encode_piece(const char *piece, size_t len, void *ctx) {
    while (len > 0) {
        size_t chunk = piece_chunk(piece, len);
        encode_chunk(ctx, piece, chunk);
        piece += chunk, len -= chunk;
    }
}

bool tokenizer_try_encode(const Tokenizer *t, const char *text, size_t len, int32_t **ids,
                          size_t *cap, size_t *n, char *err, size_t errlen) {
    Encoder e;  // fields one by one: an initializer would zero the local arrays each call
    e.t = t, e.ids = ids, e.cap = cap, e.n = 0;
    e.parts = NULL, e.heap = NULL, e.parts_cap = 0;
    if (!t->pretok) {  // the bytes tokenizer: one token per byte
        encoder_reserve(&e, len);
        for (size_t i = 0; i < len; i++) (*ids)[i] = t->byte_ids[(unsigned char)text[i]];
        *n = len;
        return true;
    }
    int rc = pretokenizer_try_split(t->pretok, text, len, encode_piece, &e);
    free(e.parts), free(e.heap);
    *n = e.n;
    return rc == 0 || pretokenizer_split_error(t->pretok, rc, err, errlen);
}

size_t tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int32_t **ids,
                        size_t *cap) {
    char err[512];
    size_t n;
    if (!tokenizer_try_encode(t, text, len, ids, cap, &n, err, sizeof err)) die_user("%s", err);
    return n;
}

// The added token whose text starts s[0, n), the longest; -1 for none.
static int32_t added_at(const Tokenizer *t, const char *s, size_t n) {
    unsigned char first = (unsigned char)s[0];
    if (!(t->added_first[first / 8] & (1u << (first % 8)))) return -1;
    for (size_t k = 0; k < t->n_added; k++) {
        int32_t id = t->added[k];
        size_t len = (size_t)t->len[id];
        if (len <= n && memcmp(s, t->blob + t->start[id], len) == 0) return id;
    }
    return -1;
}

size_t tokenizer_encode_chat(const Tokenizer *t, const char *text, size_t len, int32_t **ids,
                             size_t *cap) {
    int32_t *part = NULL;
    size_t part_cap = 0, n = 0, from = 0;
    for (size_t i = 0; i <= len; i++) {
        int32_t id = i < len ? added_at(t, text + i, len - i) : -1;
        if (id < 0 && i < len) continue;
        size_t m = i > from ? tokenizer_encode(t, text + from, i - from, &part, &part_cap) : 0;
        *ids = xgrow(*ids, cap, n + m + 1, sizeof(int32_t));
        memcpy(*ids + n, part, m * sizeof(int32_t));
        n += m;
        if (id < 0) break;
        (*ids)[n++] = id;
        from = i + (size_t)t->len[id];
        i = from - 1;
    }
    free(part);
    return n;
}
