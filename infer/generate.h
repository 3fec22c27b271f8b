// `titan generate`: a prompt's continuation from a trained model (usage in generate.c).
#pragma once

#include "core/arena.h"
#include "models/model.h"

// argv[0] is "generate"; returns the exit status (user errors exit 2 through die_user). A
// checkpoint whose architecture has its own generate (FLUX's, below) goes there.
int generate_main(int argc, char **argv);
// FLUX's: images from prompts (infer/flux_sample.c, usage there).
int flux_generate_main(int argc, char **argv);

// For the commands' options: value, die_user unless given / a number in [lo, hi] (naming flag).
const char *generate_need(const char *flag, const char *value);
long generate_parse_long(const char *flag, const char *text, long lo, long hi);
double generate_parse_double(const char *flag, const char *text, double lo, double hi);
// Memory for the parameters of m (built), no gradients: memory's (NULL: the host's, what a
// checkpoint loads into).
void generate_allocate_weights(Model *m, Arena *weights, const ArenaMemory *memory);
// The weights, loaded into host memory (generate_allocate_weights with NULL), moved to the
// memory of k (a device's, *memory set to it) in the same layout, with the model's own
// buffers (RoPE tables, MoE scratch: model_place_buffers).
void generate_place_weights(Model *m, Arena *weights, ArenaMemory *memory, const KernelOps *k);
// The kernels backend --device names (cpu or cuda), started on the first visible device; a
// user error in one line when it is unknown, not built or has no device.
const KernelOps *generate_backend(const char *device);
