// `titan tokenize`: turns text files into a token shard (data/shard.h) for training.
//
//   titan tokenize --tokenizer bytes --out OUT.bin FILE...
//
// Each input file is one document; documents are concatenated with nothing between them
// (the byte vocabulary has no special tokens). The byte tokenizer maps each byte of the UTF-8
// input to its value 0..255 (ByT5-style).
#pragma once

// argv[0] is "tokenize". Returns 0; bad usage or unreadable inputs die_user.
int tokenize_main(int argc, char **argv);
