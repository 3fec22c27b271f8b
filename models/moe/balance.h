// The expert load of a model's MoE layers and DeepSeek V3's auxiliary-loss-free load balancing
// (Wang et al. 2024, arXiv:2408.15664, as torchtitan's optimizer pre-step hook
// _update_expert_bias): each step, every expert's routed slots summed over the step's
// microbatches and over all ranks, then each layer's routing bias moves by
// coeff * sign(mean load - load), re-centred to mean zero, before the optimizer step.
//
// The layers count into `load` (StepCtx.expert_load) in host memory; the trainer sums it over
// the ranks (model code calls no collective): every rank holds other tokens (data, context
// and sequence-parallel ranks) or other layers (pipeline stages, zeros elsewhere), so the sum
// over the world is the global load. The biases are the layers' Param.buffer expert_bias_E:
// checkpointed with the model, left alone by the optimizer, updated here on every shard.
#pragma once

#include "core/param.h"
#include "kernels/kernels.h"

typedef struct MoeBalance {
    int n_layers, n_experts;
    double coeff;        // load_balance_coeff; 0: no biases, the load only measured
    bool aux_loss;       // the layers add a balance loss to the objective (aux_loss_alpha > 0)
    float *load;         // (n_layers, E) host: slots routed to each expert since the last update
    float *scratch;      // (n_layers, E) tensor memory: the load to sum, then the biases' steps
    Param **bias;        // (n_layers) each layer's expert_bias_E; NULL entries when coeff is 0
    float *step;         // (E) host scratch: one layer's biases' step
} MoeBalance;

// An expert's load relative to its layer's mean, the busiest expert's of each layer: 1 is a
// perfect balance, E all of a layer's slots on one expert (0: no slots counted).
typedef struct {
    double max;   // the worst layer's max / mean
    double mean;  // the mean over layers of max / mean
} MoeLoadStats;

void moe_balance_init(MoeBalance *b, int n_layers, int n_experts, double coeff, bool aux_loss);
// Its tensor-memory scratch, from backend k (once, at setup).
void moe_balance_place(MoeBalance *b, const KernelOps *k);
// k: the backend moe_balance_place allocated from (NULL when never placed).
void moe_balance_free(MoeBalance *b, const KernelOps *k);
// The step's load in tensor memory (n_layers * E floats) for the trainer to sum over every
// rank in place.
float *moe_balance_load(MoeBalance *b, const KernelOps *k);
// After that sum: the step's load statistics; every bias shard of t += its step (the same on
// every rank, so replicas stay equal); the load restarts from zero.
MoeLoadStats moe_balance_update(MoeBalance *b, const KernelOps *k, ParamTable *t);
// The biases' step for one layer's global load (E): coeff * sign(mean - load), minus its mean.
void moe_balance_step(float *step, const float *load, int n_experts, double coeff);
