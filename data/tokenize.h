// Tokenizing text datasets (data/dataset.h) over all cores: in memory for training, or to
// token shards on disk with `titan tokenize`:
//
//   titan tokenize --tokenizer T --out DIR [--shard-tokens N] DATASET...
//
// T is a tokenizer file or `bytes` (data/tokenizer.h). Each document becomes [BOS] ids [EOS]
// (BOS and EOS only where the tokenizer has them), and documents follow each other in dataset
// order. Documents are tokenized in parallel, each whole by one thread, and concatenated in
// order, so the tokens do not depend on the thread count. `titan tokenize` writes
// DIR/shard_000000.bin, ... (data/shard.h; version 1 when every id fits in 16 bits, else 2),
// N tokens each (default 100M) but the last, which DIR then reads back as one dataset.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "data/shard.h"
#include "data/tokenizer.h"

// The next n tokens of a dataset, in order (valid during the call only), and their TOKEN_*
// bits (data/shard.h: whether each is a target the loss trains on, as a supervised example's
// prompt and the BOS before it are not, and which end documents), NULL for pre-training text;
// bytes_read as in DocumentFn.
typedef void (*TokensFn)(const int32_t *ids, const uint8_t *flags, size_t n,
                         uint64_t bytes_read, void *ctx);

// Tokenizes the documents of the text dataset at path, passing their tokens to fn in order;
// returns the number of documents. Dies as dataset_for_each_document.
int64_t tokenize_dataset(const char *path, const Tokenizer *t, TokensFn fn, void *ctx);
// The dataset at path as a stream: the shards of a tokenized one (t is not used and may be
// NULL), or a text one tokenized by t into memory, with TokenStream.flags when it holds
// supervised examples or conversations.
void token_stream_from_dataset(TokenStream *s, const char *path, const Tokenizer *t);

// argv[0] is "tokenize". Returns 0; bad usage or unreadable inputs die_user.
int tokenize_main(int argc, char **argv);
