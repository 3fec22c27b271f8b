// `titan convert`: titan checkpoints to Hugging Face's format and back (usage in convert.c).
#pragma once

#include <stddef.h>

// argv[0] is "convert"; returns the exit status (user errors exit 2 through die_user).
int convert_main(int argc, char **argv);

// The tokenizer of a Hugging Face export in dir (which holds its config.json): tokenizer.json
// and tokenizer_config.json (a tiktoken rank file converted, a tokenizer.json copied), with
// generation_config.json and config.json's bos_token_id / eos_token_id. tokenizer_path NULL
// or "bytes", or one that does not load, gives none; note gets what was written, for the log.
void convert_hf_tokenizer(const char *tokenizer_path, const char *dir, char *note,
                          size_t notelen);
