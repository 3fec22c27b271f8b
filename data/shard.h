// Pre-tokenized token shards (llm.c's format, so llm.c's fineweb/tinystories shards load as
// they are).
//
// One shard file = a header of 256 little-endian int32, then the tokens:
//   header[0] = 20240520 (magic)
//   header[1] = version: 1 = tokens are uint16 (llm.c); 2 = tokens are uint32 (titan's
//               extension, for vocabularies over 65536)
//   header[2] = number of tokens
//   header[3..255] = 0
//   then header[2] tokens, little-endian, and nothing after them.
// llm.c's Llama 3 shards (magic 20240801, version 7, uint32 tokens) are read as well.
// A dataset path is one .bin file, or a directory whose *.bin files (hidden ones aside), sorted
// by name (bytewise), are concatenated into one token stream. Files are mmap'd read-only;
// nothing is copied. A stream can also own tokens held in memory (a text dataset tokenized at
// startup).
//
// Training reads windows of seq_len+1 tokens (inputs = window[0..seq_len), targets =
// window[1..seq_len]). Window w starts at token w*seq_len, so consecutive windows overlap by
// one token (the last target of one is the first input of the next), as llm.c's loader.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHARD_MAGIC 20240520
#define SHARD_MAGIC_LLMC_LLAMA3 20240801
#define SHARD_HEADER_INTS 256

typedef struct {
    const uint8_t *map;     // the whole file, mmap'd; NULL for tokens held in memory
    size_t bytes;
    const uint8_t *tokens;  // the first token: past the header, or the in-memory array
    int width;              // bytes per token: 2 (uint16) or 4 (uint32)
} TokenShard;

typedef struct {
    char *path;           // the dataset path, for messages
    TokenShard *shards;   // (n_shards) in stream order
    int64_t *first;       // (n_shards + 1) first[i] = stream index of shard i's first token
    int n_shards;
    int64_t num_tokens;
    int32_t *owned;       // (num_tokens) the in-memory tokens, freed on close; NULL if mapped
    // (num_tokens) for supervised data, each token's TOKEN_* bits; owned. NULL: pre-training
    // text, every token trained, documents ended by the tokenizer's EOS.
    uint8_t *flags;
} TokenStream;

// A token the loss trains on as a target (not one it only reads: a supervised example's prompt,
// data/dataset.h's DocParts, a conversation's user turns).
#define TOKEN_TRAINED 1
// The last token of its document (document masking's boundary): the EOS titan appends, or the
// last token of a rendered conversation, whose template writes EOS tokens inside it (an
// instruct model's end of turn) that end no document.
#define TOKEN_ENDS_DOCUMENT 2

// Opens a file or directory of shards; die_user naming the file on a missing path, bad magic,
// bad version, size that disagrees with the header (truncated shard) or empty dataset.
void token_stream_open(TokenStream *s, const char *path);
// token_stream_open without dying: false and a one-line reason in err (s is left closed).
bool token_stream_try_open(TokenStream *s, const char *path, char *err, size_t errlen);
// A stream of n tokens held in memory; it takes ownership of tokens (malloc'd, every id >= 0).
// path names the dataset they came from, in messages.
void token_stream_from_tokens(TokenStream *s, const char *path, int32_t *tokens, int64_t n);
// Gives s (in memory) its tokens' TOKEN_* bits: flags (num_tokens, taken over).
void token_stream_set_flags(TokenStream *s, uint8_t *flags);
void token_stream_close(TokenStream *s);

int64_t token_stream_num_tokens(const TokenStream *s);
// (num_tokens - 1) / seq_len; die_user if the stream is too short for one window.
int64_t token_stream_num_windows(const TokenStream *s, int seq_len);
// Writes the seq_len+1 token ids of window w (taken modulo the window count, so the stream
// repeats as epochs) to out.
void token_stream_window(const TokenStream *s, int64_t w, int seq_len, int32_t *out);
// The loss mask of window w's targets: out[t] = whether its token t + 1 is trained (seq_len
// values; s->flags must be set).
void token_stream_window_mask(const TokenStream *s, int64_t w, int seq_len, int32_t *out);
// The document ends of window w's inputs: out[t] = whether its token t ends a document (seq_len
// values; s->flags must be set).
void token_stream_window_ends(const TokenStream *s, int64_t w, int seq_len, int32_t *out);

// Writes n tokens as a shard of the given version (1 needs every token < 65536), to
// path.tmp first and then renamed, so a reader never sees half a shard.
void shard_write(const char *path, const uint32_t *tokens, int64_t n, int version);
