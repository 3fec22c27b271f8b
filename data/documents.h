// Documents in a packed window (training.document_masking): the loader packs documents back
// to back, each ended by the tokenizer's end-of-text token, and attention must not cross from
// one to the next (torchtitan's block_causal mask).
#pragma once

// doc (rows, T): the document of each token of tokens (rows, T), counted from 0 in each row:
// the number of end-of-text tokens (id eos) before it in its row, so that an end-of-text token
// belongs to the document it ends (as torchtitan's mask). ends (rows, T), when not NULL, marks
// the tokens that end a document in place of eos (supervised data, TOKEN_ENDS_DOCUMENT: a
// conversation holds EOS tokens that end its turns, not it).
void document_ids(const int *tokens, const int *ends, int rows, int T, int eos, int *doc);
