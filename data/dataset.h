// Datasets: where the training text comes from, as a sequence of documents.
//
// A dataset path is one file or a folder; a folder's files (not its subfolders, not its
// hidden files) are read in bytewise name order, so every rank and machine sees one order.
// A file's format comes from its name; FILE.gz is FILE compressed with gzip (or zlib):
//   .jsonl  one document per line, its "text" field (a JSON string), or a supervised example:
//           its "prompt" and "completion" fields (DocParts), or a conversation, its
//           "messages" (DocParts.conversation, data/chat.h); blank lines skipped
//   .rdb    R's lazy-load database (data/rdata.c): each character vector is a document, its
//           elements joined by "\n" (Debian's r-cran-janeaustenr ships the Austen novels so)
//   .bin    pre-tokenized shards (data/shard.h), not a source of documents
//   other   the whole file is one document (.txt and anything else)
// A folder that holds any .bin file is a tokenized dataset (its other files are ignored).
// Text is passed as bytes, unchecked: invalid UTF-8 is the tokenizer's to fall back on (but a
// .jsonl line is JSON, which must be UTF-8: one that is not is a JSON error, FILE:LINE:COL).
// Empty documents are dropped: they hold nothing to learn from, and wrapping one in BOS/EOS
// would only teach that nothing follows BOS.
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// A supervised example's parts (SFT): part k is text[end[k - 1], end[k]) (from 0), whose
// tokens are targets the loss trains on when trained[k], and context only otherwise (a
// prompt). A .jsonl line {"prompt": P, "completion": C} (TRL's prompt-completion format) is
// P untrained, then C trained. A conversation (a .jsonl line with "messages") has no text and
// no parts yet: its line, which the tokenizer's chat template renders (data/chat.h), and its
// FILE:LINE for messages.
typedef struct {
    int n;
    const size_t *end;
    const bool *trained;
    const json_t *conversation;
    const char *where;
} DocParts;

// One document, text[0, len) (not NUL-terminated, valid during the call only); parts: a
// supervised example's (NULL: pre-training text, every token trained). bytes_read is how much
// of the dataset's files on disk has been read so far (compressed bytes for .gz), for progress
// against dataset_bytes.
typedef void (*DocumentFn)(const char *text, size_t len, const DocParts *parts,
                           uint64_t bytes_read, void *ctx);

// Calls fn on every document of the text dataset at path, in order; returns their number.
// die_user naming the path when it is missing, tokenized, or holds no document, and naming
// FILE:LINE for a bad JSONL line.
int64_t dataset_for_each_document(const char *path, DocumentFn fn, void *ctx);
// True for a .bin file or a folder holding a .bin file; false for text (or a missing path).
bool dataset_is_tokenized(const char *path);
// True when the file name says token shard (ends in .bin).
bool dataset_file_is_shard(const char *path);
// The size on disk of the files dataset_for_each_document reads; die_user if path is missing.
uint64_t dataset_bytes(const char *path);

// The entries of folder for which keep(path) holds, as malloc'd "folder/name" paths sorted
// bytewise by name; NULL (errno set) when the folder cannot be read. Shared by the text and
// the token datasets so that both read a folder in one order.
char **dataset_folder_files(const char *folder, bool (*keep)(const char *path), int *n);

// The shard that holds item i of a sharded dataset, whose shard k starts at item first[k]
// (first ascending, first[0] = 0): the last shard whose first item is at or before i, so the
// empty shards before it are skipped. Shared by the token shards and the FLUX shards.
int dataset_shard_find(const int64_t *first, int n_shards, int64_t i);

// The .rdb reader (data/rdata.c): calls fn on each character vector of the database in the
// bytes data[0, len) read from file (named in messages), passing bytes_read on.
void rdata_for_each_document(const char *file, const uint8_t *data, size_t len,
                                uint64_t bytes_read, DocumentFn fn, void *ctx);
