#include "parallel/pp/stage.h"

#include "core/errors.h"

bool pp_split_blocks(int n_layers, int stages, int first_less, int last_less, int *first,
                     char *err, size_t n) {
    int effective = n_layers + first_less + last_less;
    if (stages < 1 || stages > effective)
        return error_set(err, n, "%d pipeline stages for %d layers (+%d for the embedding, +%d "
                         "for the output): a stage would have nothing to run", stages, n_layers,
                         first_less, last_less);
    int per = effective / stages, extra = effective % stages, layer = 0;
    first[0] = 0;
    for (int s = 0; s < stages; s++) {
        int mine = per + (s < extra ? 1 : 0);
        if (s == 0) mine -= first_less;
        if (s == stages - 1) mine -= last_less;
        if (mine < 0 || (mine == 0 && s > 0 && s < stages - 1) || layer + mine > n_layers)
            return error_set(err, n, "pipeline stage %d of %d would get %d transformer layers of "
                             "%d (pipeline_parallel_first_stage_less_layers %d, "
                             "last_stage_less_layers %d)", s, stages, mine, n_layers,
                             first_less, last_less);
        layer += mine;
        // Block 0 is the embedding, blocks 1..L the layers, L+1 the head.
        first[s + 1] = 1 + layer + (s == stages - 1 ? 1 : 0);
    }
    if (layer != n_layers)
        return error_set(err, n, "pipeline stages hold %d of %d layers", layer, n_layers);
    return true;
}

int pp_stages_per_rank(int n_layers, int pp, int layers_per_stage, int first_less,
                       int last_less, char *err, size_t n) {
    int effective = n_layers + first_less + last_less;
    int stages = (effective + layers_per_stage - 1) / layers_per_stage;
    if (stages % pp != 0) {
        error_set(err, n, "parallelism.pipeline_parallel_layers_per_stage %d makes %d stages of "
                  "%d effective layers, which pipeline_parallel_degree %d does not divide",
                  layers_per_stage, stages, effective, pp);
        return -1;
    }
    return stages / pp;
}
