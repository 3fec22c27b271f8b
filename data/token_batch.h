// A language model's step inputs: what the token pipeline (data/loader.h) yields, in the
// backend's memory. The decoder architectures (models/decoder) take one as StepCtx.input; the
// trainer fills it and cuts microbatches from it.
#pragma once

#include <stddef.h>

typedef struct {
    const int *tokens;   // (B, T) inputs
    const int *targets;  // (B, T) next tokens
    const int *pos;      // (T) RoPE position of each sequence index
    // (B, whole sequence length) the document id of every token of the whole sequences, in
    // sequence order, also under context parallel (where T is this rank's share):
    // training.document_masking, attention stays within a document. NULL: causal attention.
    const int *doc;
    // (B, T) 1 where the target counts, 0 where the loss ignores it (SFT's prompt tokens,
    // torchtitan's IGNORE_INDEX labels), whatever the target there is. NULL: every one counts.
    const int *loss_mask;
} TokenBatch;

// The rows [first, first + rows) of b, its microbatch: T the tokens of each row b holds,
// whole_T the length of the whole sequences (doc's rows). Missing tensors stay NULL.
static inline TokenBatch token_batch_rows(const TokenBatch *b, int first, int T, int whole_T) {
    size_t at = (size_t)first * T;
    return (TokenBatch){.tokens = b->tokens ? b->tokens + at : NULL,
                        .targets = b->targets ? b->targets + at : NULL,
                        .pos = b->pos,
                        .doc = b->doc ? b->doc + (size_t)first * whole_T : NULL,
                        .loss_mask = b->loss_mask ? b->loss_mask + at : NULL};
}
