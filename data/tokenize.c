#include "data/tokenize.h"

#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/errors.h"
#include "core/files.h"
#include "data/chat.h"
#include "data/dataset.h"

// Documents are gathered into batches and each batch is tokenized in parallel: enough text to
// keep every core busy, little enough to report progress often and hold in memory.
#define BATCH_BYTES ((size_t)16 << 20)
#define BATCH_DOCS 65536

typedef struct {
    const Tokenizer *t;
    TokensFn fn;
    void *ctx;
    char *text;             // (text_cap) the batch's documents, back to back
    size_t text_len, text_cap;
    size_t start[BATCH_DOCS + 1];  // document i is text[start[i], start[i + 1])
    int n_docs;
    // A supervised example's parts (DocParts, their ends relative to its start): document i's
    // are parts [first_part[i], first_part[i + 1]) of part_end and part_trained (none: text).
    int first_part[BATCH_DOCS + 1];
    size_t *part_end, parts_cap, trained_cap;
    bool *part_trained;
    bool chat[BATCH_DOCS];  // document i is a conversation its chat template rendered
    bool supervised;        // some document of the batch has parts
    int32_t *ids[BATCH_DOCS];  // document i's ids; the buffers are kept from batch to batch
    size_t n_ids[BATCH_DOCS], cap[BATCH_DOCS];
    uint8_t *trained[BATCH_DOCS];  // a supervised document's: whether each of its ids is
    size_t trained_ids_cap[BATCH_DOCS];
    int32_t *out;           // (out_cap) the batch's tokens, wrapped and in order
    uint8_t *out_flags;     // (out_cap) their TOKEN_* bits, when the batch is supervised
    size_t out_cap, out_flags_cap;
    uint64_t bytes_read;    // after the batch's last document
} Batch;

// Whether document i's last token is trained (its EOS is then too: the model learns to stop).
static bool ends_trained(const Batch *b, int i) {
    int last = b->first_part[i + 1] - 1;
    return last < b->first_part[i] || b->part_trained[last];
}

// The batch's documents as [BOS] ids [EOS] (BOS and EOS where the tokenizer has them; a
// conversation as its template rendered it, which writes its own), and when supervised each
// token's TOKEN_* bits (a BOS is never trained: nothing predicts it).
static size_t batch_wrap(Batch *b) {
    int32_t bos = tokenizer_bos_id(b->t), eos = tokenizer_eos_id(b->t);
    size_t total = 0;
    for (int i = 0; i < b->n_docs; i++) total += b->n_ids[i] + (bos >= 0) + (eos >= 0);
    b->out = xgrow(b->out, &b->out_cap, total, sizeof(int32_t));
    if (b->supervised) b->out_flags = xgrow(b->out_flags, &b->out_flags_cap, total, 1);
    size_t n = 0;
    for (int i = 0; i < b->n_docs; i++) {
        bool parts = b->first_part[i + 1] > b->first_part[i];
        bool add_bos = bos >= 0 && !b->chat[i], add_eos = eos >= 0 && !b->chat[i];
        if (b->supervised) {
            if (add_bos) b->out_flags[n] = 0;
            uint8_t *to = b->out_flags + n + add_bos;
            if (parts) memcpy(to, b->trained[i], b->n_ids[i]);
            else memset(to, TOKEN_TRAINED, b->n_ids[i]);
            if (add_eos) to[b->n_ids[i]] = ends_trained(b, i) ? TOKEN_TRAINED : 0;
            if (b->n_ids[i] + add_eos > 0) to[b->n_ids[i] + add_eos - 1] |= TOKEN_ENDS_DOCUMENT;
        }
        if (add_bos) b->out[n++] = bos;
        memcpy(b->out + n, b->ids[i], b->n_ids[i] * sizeof(int32_t));
        n += b->n_ids[i];
        if (add_eos) b->out[n++] = eos;
    }
    return n;
}

// A conversation's ids: the rendered text encoded whole, added tokens recognised, as
// transformers tokenizes it; a token is trained when it overlaps a trained part (an assistant
// turn), as return_assistant_tokens_mask marks tokens by their characters.
static void conversation_encode(Batch *b, int i) {
    const char *text = b->text + b->start[i];
    size_t n = tokenizer_encode_chat(b->t, text, b->start[i + 1] - b->start[i], &b->ids[i],
                                     &b->cap[i]);
    b->trained[i] = xgrow(b->trained[i], &b->trained_ids_cap[i], n, 1);
    int k = b->first_part[i], end = b->first_part[i + 1];
    size_t at = 0;
    for (size_t j = 0; j < n; j++) {
        size_t len;
        tokenizer_token_bytes(b->t, b->ids[i][j], &len);
        while (k < end && b->part_end[k] <= at) k++;
        bool trained = false;
        for (int q = k; q < end && (q == k || b->part_end[q - 1] < at + len); q++)
            trained = trained || b->part_trained[q];
        b->trained[i][j] = trained ? TOKEN_TRAINED : 0;
        at += len;
    }
    CHECK(at == b->start[i + 1] - b->start[i]);  // byte-level: the tokens spell the text
    b->n_ids[i] = n;
}

// Document i's ids: its text's, or its parts' one after another, each encoded alone, and then
// whether each is trained; a conversation's by conversation_encode.
static void document_encode(Batch *b, int i) {
    const char *text = b->text + b->start[i];
    if (b->chat[i]) {
        conversation_encode(b, i);
        return;
    }
    if (b->first_part[i + 1] == b->first_part[i]) {
        b->n_ids[i] = tokenizer_encode(b->t, text, b->start[i + 1] - b->start[i], &b->ids[i],
                                       &b->cap[i]);
        return;
    }
    int32_t *part = NULL;
    size_t part_cap = 0, n = 0, from = 0;
    for (int k = b->first_part[i]; k < b->first_part[i + 1]; k++) {
        size_t m = tokenizer_encode(b->t, text + from, b->part_end[k] - from, &part, &part_cap);
        b->ids[i] = xgrow(b->ids[i], &b->cap[i], n + m, sizeof(int32_t));
        b->trained[i] = xgrow(b->trained[i], &b->trained_ids_cap[i], n + m, 1);
        memcpy(b->ids[i] + n, part, m * sizeof(int32_t));
        memset(b->trained[i] + n, b->part_trained[k] ? TOKEN_TRAINED : 0, m);
        n += m, from = b->part_end[k];
    }
    free(part);
    b->n_ids[i] = n;
}

static void batch_flush(Batch *b) {
    // Dynamic scheduling, as documents' lengths differ by orders of magnitude.
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < b->n_docs; i++) document_encode(b, i);
    size_t n = batch_wrap(b);  // before reading b->out, which it may move
    b->fn(b->out, b->supervised ? b->out_flags : NULL, n, b->bytes_read, b->ctx);
    b->n_docs = 0, b->text_len = 0, b->supervised = false;
}

static void document_add(Batch *b, const char *text, size_t len, const DocParts *parts,
                         bool chat, uint64_t bytes_read) {
    if (b->n_docs == BATCH_DOCS || (b->n_docs > 0 && b->text_len + len > BATCH_BYTES))
        batch_flush(b);
    b->text = xgrow(b->text, &b->text_cap, b->text_len + len, 1);
    memcpy(b->text + b->text_len, text, len);
    b->start[b->n_docs] = b->text_len;
    b->chat[b->n_docs] = chat;
    int first = b->first_part[b->n_docs], n_parts = parts ? parts->n : 0;
    b->part_end = xgrow(b->part_end, &b->parts_cap, (size_t)(first + n_parts), sizeof(size_t));
    b->part_trained = xgrow(b->part_trained, &b->trained_cap, (size_t)(first + n_parts),
                            sizeof(bool));
    for (int k = 0; k < n_parts; k++) {
        b->part_end[first + k] = parts->end[k];
        b->part_trained[first + k] = parts->trained[k];
    }
    b->supervised = b->supervised || n_parts > 0;
    b->text_len += len;
    b->start[++b->n_docs] = b->text_len;
    b->first_part[b->n_docs] = first + n_parts;
    b->bytes_read = bytes_read;
}

// A conversation, rendered by the tokenizer's chat template: its text, the assistant turns
// trained and the rest not.
static void conversation_add(Batch *b, const DocParts *conv, uint64_t bytes_read) {
    char err[1024];
    const json_t *specials;
    const Jinja *tmpl = tokenizer_chat_template(b->t, &specials, err, sizeof err);
    if (!tmpl) die_user("%s: a conversation (\"messages\") is rendered by the tokenizer's chat "
                        "template: %s", conv->where, err);
    ChatExample e;
    if (!chat_render(tmpl, specials, conv->conversation, &e, err, sizeof err))
        die_user("%s: %s", conv->where, err);
    int n = 2 * e.n + 1;
    size_t *end = xmalloc((size_t)n * sizeof(size_t));
    bool *trained = xmalloc((size_t)n * sizeof(bool));
    for (int k = 0; k < e.n; k++) {
        end[2 * k] = e.start[k], trained[2 * k] = false;
        end[2 * k + 1] = e.end[k], trained[2 * k + 1] = true;
    }
    end[n - 1] = e.len, trained[n - 1] = false;
    document_add(b, e.text, e.len, &(DocParts){n, end, trained, NULL, NULL}, true, bytes_read);
    free(end), free(trained);
    chat_example_free(&e);
}

static void batch_add(const char *text, size_t len, const DocParts *parts, uint64_t bytes_read,
                      void *ctx) {
    if (parts && parts->conversation) conversation_add(ctx, parts, bytes_read);
    else document_add(ctx, text, len, parts, false, bytes_read);
}

int64_t tokenize_dataset(const char *path, const Tokenizer *t, TokensFn fn, void *ctx) {
    Batch *b = xcalloc(1, sizeof(Batch));  // 2 MB of per-document arrays: not on the stack
    b->t = t, b->fn = fn, b->ctx = ctx;
    int64_t documents = dataset_for_each_document(path, batch_add, b);
    batch_flush(b);
    for (int i = 0; i < BATCH_DOCS; i++) free(b->ids[i]), free(b->trained[i]);
    free(b->text), free(b->out), free(b->out_flags), free(b->part_end), free(b->part_trained);
    free(b);
    return documents;
}

typedef struct {
    int32_t *ids;
    uint8_t *flags;  // once some document is supervised: every token's TOKEN_* bits
    size_t n, cap, flags_cap;
    int32_t eos;     // the tokenizer's, which ends each pre-training document
} TokenArray;

// Pre-training text's bits: every token trained, each EOS the end of a document.
static void text_flags(uint8_t *flags, const int32_t *ids, size_t n, int32_t eos) {
    for (size_t i = 0; i < n; i++)
        flags[i] = TOKEN_TRAINED | (ids[i] == eos ? TOKEN_ENDS_DOCUMENT : 0);
}

static void tokens_append(const int32_t *ids, const uint8_t *flags, size_t n,
                          uint64_t bytes_read, void *ctx) {
    (void)bytes_read;
    TokenArray *a = ctx;
    a->ids = xgrow(a->ids, &a->cap, a->n + n, sizeof(int32_t));
    memcpy(a->ids + a->n, ids, n * sizeof(int32_t));
    if (flags && !a->flags) {  // the tokens before were pre-training text
        a->flags = xgrow(NULL, &a->flags_cap, a->n + n, 1);
        text_flags(a->flags, a->ids, a->n, a->eos);
    }
    if (a->flags) {
        a->flags = xgrow(a->flags, &a->flags_cap, a->n + n, 1);
        if (flags) memcpy(a->flags + a->n, flags, n);
        else text_flags(a->flags + a->n, ids, n, a->eos);
    }
    a->n += n;
}

void token_stream_from_dataset(TokenStream *s, const char *path, const Tokenizer *t) {
    if (dataset_is_tokenized(path)) {
        token_stream_open(s, path);
        return;
    }
    CHECK(t);
    TokenArray a = {.eos = tokenizer_eos_id(t)};
    tokenize_dataset(path, t, tokens_append, &a);
    token_stream_from_tokens(s, path, a.ids, (int64_t)a.n);
    if (a.flags) token_stream_set_flags(s, a.flags);
}

// ---- titan tokenize ----

#define USAGE "usage: titan tokenize --tokenizer T --out DIR [--shard-tokens N] DATASET..."
#define SHARD_TOKENS_DEFAULT 100000000

typedef struct {
    const char *tokenizer, *out;
    int64_t shard_tokens;
    char **inputs;
    int n_inputs;
} TokenizeArgs;

static int64_t shard_tokens_parse(const char *s) {
    char *end;
    long long n = strtoll(s, &end, 10);
    // A shard's header counts its tokens in an int32.
    if (*s == '\0' || *end != '\0' || n < 1 || n > INT32_MAX)
        die_user("tokenize: --shard-tokens %s is not a whole number from 1 to %d", s, INT32_MAX);
    return n;
}

static TokenizeArgs args_parse(int argc, char **argv) {
    help_exit_if_asked(argc, argv, USAGE);
    TokenizeArgs a = {.shard_tokens = SHARD_TOKENS_DEFAULT,
                      .inputs = xmalloc((size_t)argc * sizeof(char *))};
    for (int i = 1; i < argc; i++) {
        bool has_value = i + 1 < argc;
        if (strcmp(argv[i], "--tokenizer") == 0 && has_value) a.tokenizer = argv[++i];
        else if (strcmp(argv[i], "--out") == 0 && has_value) a.out = argv[++i];
        else if (strcmp(argv[i], "--shard-tokens") == 0 && has_value)
            a.shard_tokens = shard_tokens_parse(argv[++i]);
        else if (argv[i][0] == '-') die_user("tokenize: bad option %s; " USAGE, argv[i]);
        else a.inputs[a.n_inputs++] = argv[i];
    }
    if (!a.tokenizer || !a.out || a.n_inputs == 0) die_user(USAGE);
    return a;
}

// The progress line on stderr: redrawn in place on a terminal, else (a log file) one line now
// and then so that the log stays readable.
typedef struct {
    bool tty;
    double start, shown;  // omp_get_wtime() at the start and at the last line
    uint64_t bytes_total;
} Progress;

static void progress_show(Progress *p, uint64_t bytes_done, int64_t tokens) {
    double now = omp_get_wtime(), elapsed = now - p->start;
    if (now - p->shown < (p->tty ? 0.5 : 5.0)) return;
    p->shown = now;
    double done = p->bytes_total ? (double)bytes_done / (double)p->bytes_total : 1.0;
    // The rest at the byte rate so far (how many tokens the rest holds is not known).
    int eta = done > 0 ? (int)(elapsed * (1 - done) / done) : 0;
    char bar[31];
    for (int i = 0; i < 30; i++) bar[i] = i < (int)(done * 30) ? '#' : '.';
    bar[30] = '\0';
    fprintf(stderr, "%stokenize: [%s] %3.0f%%  %.1f/%.1f MB  %.2fM tokens/s  ETA %d:%02d:%02d%s",
            p->tty ? "\r" : "", bar, 100 * done, (double)bytes_done / 1e6,
            (double)p->bytes_total / 1e6, (double)tokens / elapsed / 1e6, eta / 3600,
            eta / 60 % 60, eta % 60, p->tty ? "\033[K" : "\n");
}

// The tokens of every input, cut into shards of shard_tokens.
typedef struct {
    const char *dir;
    int32_t *shard;  // (shard_tokens) the shard being filled
    int64_t n, shard_tokens, tokens;
    int shards, version;
    uint64_t bytes_before;  // size of the inputs before the current one
    Progress progress;
} ShardWriter;

static void shard_flush(ShardWriter *w) {
    char path[4096];
    if (snprintf(path, sizeof(path), "%s/shard_%06d.bin", w->dir, w->shards) >= (int)sizeof(path))
        die_user("tokenize: the output path %s is too long", w->dir);
    // Token ids are never negative, so int32 and uint32 agree on them.
    shard_write(path, (const uint32_t *)w->shard, w->n, w->version);
    w->shards++, w->n = 0;
}

static void shard_add(const int32_t *ids, const uint8_t *flags, size_t n, uint64_t bytes_read,
                      void *ctx) {
    ShardWriter *w = ctx;
    if (flags)
        die_user("titan tokenize: supervised examples (\"prompt\" and \"completion\", or "
                 "\"messages\") are tokenized when training starts: token shards hold no loss "
                 "mask");
    for (size_t done = 0; done < n;) {
        size_t room = (size_t)(w->shard_tokens - w->n), take = n - done < room ? n - done : room;
        memcpy(w->shard + w->n, ids + done, take * sizeof(int32_t));
        w->n += (int64_t)take, done += take;
        if (w->n == w->shard_tokens) shard_flush(w);
    }
    w->tokens += (int64_t)n;
    progress_show(&w->progress, w->bytes_before + bytes_read, w->tokens);
}

// Fails before any work: a missing input, or an --out that already holds shards, which the
// new ones would silently join.
static uint64_t inputs_check(const TokenizeArgs *a) {
    if (dataset_is_tokenized(a->out))
        die_user("tokenize: %s already holds token shards; remove it or choose another --out",
                 a->out);
    uint64_t total = 0;
    for (int i = 0; i < a->n_inputs; i++) total += dataset_bytes(a->inputs[i]);
    return total;
}

int tokenize_main(int argc, char **argv) {
    TokenizeArgs a = args_parse(argc, argv);
    uint64_t bytes_total = inputs_check(&a);
    Tokenizer *t = tokenizer_load(a.tokenizer);
    make_dirs(a.out);
    double start = omp_get_wtime();
    ShardWriter w = {.dir = a.out, .shard = xmalloc((size_t)a.shard_tokens * sizeof(int32_t)),
                     .shard_tokens = a.shard_tokens,
                     .version = tokenizer_vocab_size(t) <= 65536 ? 1 : 2,
                     .progress = {.tty = isatty(2), .start = start, .shown = start,
                                  .bytes_total = bytes_total}};
    int64_t documents = 0;
    for (int i = 0; i < a.n_inputs; i++) {
        documents += tokenize_dataset(a.inputs[i], t, shard_add, &w);
        w.bytes_before += dataset_bytes(a.inputs[i]);
    }
    if (w.n > 0) shard_flush(&w);
    if (w.progress.tty) fputs("\r\033[K", stderr);
    double seconds = omp_get_wtime() - start;
    log_info("tokenize: %lld documents, %llu bytes -> %lld tokens in %d shards (%s), %.1f s, "
             "%.2fM tokens/s",
             (long long)documents, (unsigned long long)bytes_total, (long long)w.tokens, w.shards,
             a.out, seconds, (double)w.tokens / seconds / 1e6);
    tokenizer_free(t);
    free(w.shard), free(a.inputs);
    return 0;
}
