// `titan tokenizer train`: learns a byte-level BPE vocabulary the way GPT-2, tiktoken and
// Hugging Face tokenizers train theirs, and writes it as a tiktoken rank file that
// data/tokenizer.h loads.
//
//   titan tokenizer train --vocab-size N --out FILE.tiktoken [--threads T] FILE...
//
// Text is cut into pieces by cl100k's regex (data/pretokenize.h); merges never cross a piece.
// Ranks 0..255 are the single bytes in byte order. Each step merges the adjacent token pair
// that occurs most often over all pieces (weighted by how often each piece occurs) into a new
// token with the next rank, until there are N - 2 ranks: N counts titan's BOS and EOS, which
// the loader appends as ranks N - 2 and N - 1, so a model with vocab_size N fits exactly.
// Training stops early when no pair occurs twice.
//
// Tie-break: among pairs of equal count the one with the lower (left rank, right rank) wins,
// compared left rank first (Hugging Face's trainer orders its heap the same way). With it the
// output depends only on the input text, never on the thread count or the run.
//
// Ranks are assigned in merge order, so tiktoken's encoding (merge the adjacent pair whose
// bytes have the lowest rank, repeatedly) replays the training merges. A merge whose bytes are
// already a token (two different pairs can spell the same string) is skipped, because a rank
// file maps each byte string to one rank.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BPE_TRAIN_SPECIALS 2  // BOS and EOS, counted in --vocab-size but not written
#define BPE_TRAIN_MIN_VOCAB (256 + BPE_TRAIN_SPECIALS)
#define BPE_TRAIN_MAX_VOCAB (INT64_C(1) << 31)  // keeps every id, specials too, in an int32

typedef struct {
    const char *text;
    size_t len;
} BpeDocument;

typedef struct {
    const BpeDocument *docs;
    size_t n_docs;
} BpeTrainInput;

// The trained ranks: token r is bytes[offsets[r], offsets[r + 1]).
typedef struct {
    int32_t n_tokens;
    int64_t *offsets;  // (n_tokens + 1)
    uint8_t *bytes;    // (offsets[n_tokens])
} BpeVocab;

typedef struct {
    int64_t documents, bytes;
    int64_t pieces;      // distinct pieces
    int32_t merges;      // ranks added after the 256 bytes
    int32_t duplicates;  // merges skipped because their bytes were already a token
    bool stopped_early;  // no pair occurred twice before the vocabulary was full
} BpeTrainStats;

// Trains a vocabulary of vocab_size - BPE_TRAIN_SPECIALS ranks (fewer if it stops early) on the
// documents; vocab_size must lie in [BPE_TRAIN_MIN_VOCAB, BPE_TRAIN_MAX_VOCAB]. Pre-tokenization
// runs on `threads` OpenMP threads; the result is the same for any thread count.
BpeVocab bpe_train(const BpeTrainInput *in, int64_t vocab_size, int threads,
                   BpeTrainStats *stats);
// Writes one line "<base64 of token bytes> <rank>" per rank to path (via path.tmp and a rename,
// so a partial file never takes the name); die_user naming the file when it cannot be written.
void bpe_vocab_write(const BpeVocab *v, const char *path);
void bpe_vocab_free(BpeVocab *v);

// `titan tokenizer train`'s usage line, which its --help and `titan tokenizer --help` print.
#define TOKENIZER_TRAIN_USAGE \
    "usage: titan tokenizer train --vocab-size N --out FILE.tiktoken [--threads T] FILE..."
// argv[0] is "train"; FILES are datasets (data/dataset.h: text, JSONL, R data, folders).
// Returns 0; bad usage, unreadable or empty inputs die_user.
int tokenizer_train_main(int argc, char **argv);
