// Byte-level BPE tokenizers: one encoder for the three file formats the field ships.
//
//   - a tiktoken rank file (Meta's Llama 3 `tokenizer.model`, `cl100k_base.tiktoken`, and what
//     `titan tokenizer train` writes): lines "<base64 token bytes> <rank>";
//   - a Hugging Face `tokenizer.json` (BPE model, byte-level pre-tokenizer, added tokens);
//   - GPT-2's `encoder.json` + `vocab.bpe` (pass either file or their folder).
// The format is detected from the file's content (or the folder's files). Pre-tokenization
// uses each format's regex (data/pretokenize.h); merges follow the ranks exactly as tiktoken
// and Hugging Face do, so ids equal theirs. Special tokens (BOS/EOS, Llama 3's reserved set,
// cl100k's <|endoftext|>, ...) are added as those tokenizers add them, and are never produced
// from ordinary text by encode.
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// The largest tokenizer file titan reads, far above any real one (Llama 3's tokenizer.json:
// 9 MB; a 1M-token vocabulary's about 60 MB).
#define TOKENIZER_MAX_BYTES (1u << 30)

typedef struct Tokenizer Tokenizer;

// The tokenizer at path; die_user naming the file on a missing or malformed one.
Tokenizer *tokenizer_load(const char *path);
// tokenizer_load without dying: NULL and a one-line reason in err.
Tokenizer *tokenizer_try_load(const char *path, char *err, size_t errlen);
void tokenizer_free(Tokenizer *t);

int tokenizer_vocab_size(const Tokenizer *t);  // every id, special tokens included
int tokenizer_bos_id(const Tokenizer *t);      // -1 when the vocabulary has none
int tokenizer_eos_id(const Tokenizer *t);      // -1 when the vocabulary has none
const char *tokenizer_format(const Tokenizer *t);  // "tiktoken", "huggingface", "gpt2"

// The longest piece (a run of text the pre-tokenizer keeps together) merged whole: a longer
// one is merged in chunks of at most this many bytes, cut at a character boundary, so that a
// pathological document (a regex that keeps it whole, a megabyte without a space) costs
// bounded memory; merging is O(n log n) in the chunk. Above 4 x 25,000, so a piece that Meta's
// Llama 3 tokenizer keeps whole (it cuts runs at 25,000 characters) is merged whole here too;
// tiktoken and Hugging Face merge any length whole, so only pieces over 256 KiB can differ.
#define TOKENIZER_PIECE_MAX (1 << 18)

// Writes the ids of text[0, len) (no special tokens are recognised in it) to (*ids)[0..),
// growing *ids with realloc as needed (*cap is its capacity in ids); returns their number.
// Thread-safe: several threads may encode with one Tokenizer at once. A pre-tokenizer regex
// whose match fails with a PCRE2 error on this text (a match limit it sets) is a user error
// (exit 2) naming the tokenizer file.
size_t tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int32_t **ids,
                        size_t *cap);
// tokenizer_encode for text a chat template rendered (data/chat.h): the text of each added
// token (special tokens, and added ones such as Qwen3's <think>) becomes that token, leftmost and
// longest first, the text between them is encoded as by tokenizer_encode: as transformers'
// apply_chat_template tokenizes its rendering.
size_t tokenizer_encode_chat(const Tokenizer *t, const char *text, size_t len, int32_t **ids,
                             size_t *cap);
// The chat template of the tokenizer_config.json (its `chat_template`, or the "default" one of
// a list) or chat_template.jinja beside the tokenizer's file, and in *specials the special
// tokens' text it renders with (tokenizer_config.json's bos_token, eos_token, unk_token,
// sep_token, pad_token, cls_token, mask_token where set: transformers' special_tokens_map);
// NULL with the reason in err when there is none or titan cannot parse it (data/jinja.h).
typedef struct Jinja Jinja;
const Jinja *tokenizer_chat_template(const Tokenizer *t, const json_t **specials, char *err,
                                     size_t errlen);
// tokenizer_encode without dying: false and the one-line reason in err on such a failed match
// (*n then counts the ids of the text before it).
bool tokenizer_try_encode(const Tokenizer *t, const char *text, size_t len, int32_t **ids,
                          size_t *cap, size_t *n, char *err, size_t errlen);
// The bytes of ids (special tokens as their text), malloc'd and NUL-terminated; *len is set
// to the byte count. Ids outside [0, vocab size) are a caller bug (exit 3); an id inside it
// that no token has (cl100k leaves 17 such holes, as tiktoken does) decodes to no bytes, so a
// model that samples one does not stop generation.
char *tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n, size_t *len);
// The bytes of one id (no NUL; *len set), pointing into the tokenizer: for streaming decode.
const char *tokenizer_token_bytes(const Tokenizer *t, int32_t id, size_t *len);

// Writes a tiktoken rank file's tokenizer as Hugging Face's dir/tokenizer.json (byte-level BPE,
// merges recovered from the ranks as transformers' TikTokenConverter does, cl100k's pattern,
// the special tokens after the ranks), byte for byte what scripts/peer/hf_tokenizer.py writes,
// and dir/tokenizer_config.json (hf_tokenizer.py's keys and Llama 3's model_input_names).
// False with a reason for another format or a write error.
bool tokenizer_write_hf(const Tokenizer *t, const char *dir, char *err, size_t errlen);
