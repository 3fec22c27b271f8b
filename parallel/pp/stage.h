// Pipeline stages: which contiguous blocks each virtual stage runs (docs/design.md "Blocks": a
// stage is a slice of the block list embed, layers.0 .. layers.{L-1}, head). Pure host code.
#pragma once

#include <stdbool.h>
#include <stddef.h>

// torchtitan's split (generate_llm_fqn_per_model_part): the embedding counts as first_less
// layers and the head as last_less, so that the first and last stages, which also hold them,
// get that many fewer transformer layers; the L + first_less + last_less effective layers are
// spread evenly over the stages, the first stages taking one more when they do not divide.
// first (stages + 1): stage s runs blocks [first[s], first[s + 1]) of the L + 2. False with
// one line in err when a stage would get no block or fewer layers than it must give up.
bool pp_split_blocks(int n_layers, int stages, int first_less, int last_less, int *first,
                     char *err, size_t n);

// The stages per rank that pipeline_parallel_layers_per_stage asks for (torchtitan's rule):
// ceil(effective layers / layers_per_stage) virtual stages, which pp must divide. -1 with
// one line in err otherwise.
int pp_stages_per_rank(int n_layers, int pp, int layers_per_stage, int first_less,
                       int last_less, char *err, size_t n);
