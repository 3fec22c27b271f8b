// A token-choice top-k mixture-of-experts layer (torchtitan's models/common/moe.py MoE, as
// DeepSeek-MoE / Qwen3-MoE use it): the FFN of a transformer block on rows (rows, D) -> (rows,
// D), usable by any architecture, which calls it from its own block on the rows it holds
// (under tensor parallel: this rank's sequence-parallel rows, the layer's weights replicated;
// under expert parallel, StepCtx.ep, the routed experts are this rank's E / ep and the sorted
// rows travel to the ranks holding theirs and back, parallel/ep/ep.h).
//
//   router:  scores = softmax|sigmoid(x Wg^T) in fp32; each token's top k experts by scores +
//            expert_bias (the bias only steers the choice, DeepSeek V3's auxiliary-loss-free
//            balancing); weights = the chosen scores (normed, scaled)
//   experts: the tokens' k slots sorted by expert, run as grouped GEMMs with SwiGLU between:
//            out_e = (silu(x W1_e^T) * (x W3_e^T)) W2_e^T
//   combine: y += sum over a token's slots of weight * out (LocalTokenDispatcher.combine:
//            weighted after the experts)
//   shared:  y += a dense SwiGLU FFN of its own width (optional)
//
// Forward and backward are written out (no autograd); every buffer comes from the microbatch's
// activation arena, sized by the same code with rows * k rows (no token dropped) as the bound
// of the data-dependent expert rows.
#pragma once

#include <stdbool.h>

#include "core/config.h"
#include "core/param.h"
#include "models/linear.h"
#include "protocols/block.h"

typedef struct {
    int dim, hidden;          // D; F: each routed expert's hidden width
    MoeRouter router;         // n_experts (E), top_k (k), score function, routing groups
    int shared_hidden;        // the shared experts' FFN width; 0: none
    // When > 0 an expert takes at most ceil(capacity_factor * rows * k / E) of a forward's
    // slots, the later ones dropped (their token gets nothing from that expert); 0: none.
    double capacity_factor;
    // Auxiliary-loss-free balancing's bias step (balance.h); 0: the layer has no expert bias.
    double load_balance_coeff;
    // DeepSeek V3's sequence-wise balance loss weight alpha: alpha * sum_i f_i P_i per sequence
    // (f_i = E / (k T) * the sequence's slots routed to expert i, P_i = the mean over its
    // tokens of the normalised scores), averaged over the microbatch's sequences and added to
    // the objective; 0: off. Needs whole sequences on the tp group (not context parallel).
    double aux_loss_alpha;
} MoeArgs;

typedef struct {
    const MoeArgs *args;
    int index;                  // which of the model's MoE layers: its row of the expert load
    Param *gate;                // (E, D) the router's Linear, fp32
    Param *w1, *w3;             // (E, F, D) stacked experts (Param.expert)
    Param *w2;                  // (E, D, F)
    Param *shared_w1, *shared_w3;  // (Fs, D); NULL without shared experts
    Param *shared_w2;           // (D, Fs)
    Param *expert_bias;         // (E) the routing bias (a Param.buffer); NULL: none
    // The GEMMs of the weights of the same names (models/linear.h): the experts' grouped, the
    // shared experts' unset without them.
    struct { Linear gate, w1, w2, w3, shared_w1, shared_w2, shared_w3; } linear;
    int *host_counts;           // host: counts, offsets (and expert parallel's plan), per call
} MoeLayer;

// What forward keeps for backward (pointers into the microbatch's activation arena). R = rows
// * k: the expert-sorted rows, of which offsets[E] <= R are kept. Rl: the rows this rank's
// experts run on: R, or under expert parallel ExpertHooks.recv_rows_bound's bound (the rows
// every rank sent for this rank's E / ep experts, grouped by local expert).
typedef struct {
    float *scores;            // (rows, E) softmax or sigmoid of the router logits
    float *weight;            // (rows, k) each slot's combine weight
    int *experts;             // (rows, k) each slot's expert
    int *counts;              // (2E + 1) slots routed to each expert (E), then offsets (E + 1);
                              // under expert parallel E more: the exchanged counts (ep, E / ep)
    int *row_of_slot;         // (rows * k) sorted row of each slot, -1: dropped
    float *xs;                // (Rl, D) the dispatched tokens, in this rank's experts' order
    float *gate, *up, *act;   // (Rl, F) x3: xs W1^T, xs W3^T, silu(gate) * up
    float *out;               // (R, D) the experts' outputs for this rank's slots, unweighted
    float *sgate, *sup, *sact;  // (rows, Fs) x3: the shared experts' (NULL without)
    float *frac;              // (2, B, E) the balance loss's f then P per sequence (NULL: off)
} MoeSaved;

// How a layer's weights start: `kind` (a normal or truncated normal) of these stds, the shared
// experts' w1, w2, w3 as the routed experts'. The architecture decides them (models/decoder).
typedef struct {
    ParamInit kind;
    double gate, w1, w2, w3;
} MoeInit;

// Adds the layer's parameters to t under prefix ("layers.3."), with torchtitan's names
// (moe.router.gate.weight, moe.routed_experts.inner_experts.w1_EFD / w2_EDF / w3_EFD,
// moe.shared_experts.w1/w2/w3.weight; with a load_balance_coeff the buffer moe.expert_bias_E,
// zeros), initialised as init says, and after the router's and the shared experts' weights
// their LoRA adapters where lora (NULL: none) targets them (models/lora.h). The layer keeps
// args (not copied). Allocates the host scratch.
void moe_layer_init(MoeLayer *m, const MoeArgs *args, int index, ParamTable *t,
                    const char *prefix, const MoeInit *init, const LoraSection *lora);
// The model.moe_* keys over a flavor's MoE settings (an architecture's update_from_config):
// the balancing coefficient (null: 0, no bias), the balance loss weight, the capacity factor
// (null: 0, none dropped).
void moe_args_from_config(MoeArgs *a, const ModelSection *c);

// Hugging Face's name (after "model.layers.N.") of the layer's tensor `name` (after
// "layers.N."): the router is mlp.gate.weight, expert j of a stacked w1 / w3 / w2 its own
// mlp.experts.J.gate_proj / up_proj / down_proj (a (F, D) or (D, F) slice of the stack), the
// shared experts mlp.shared_experts.*; the expert bias DeepseekV3's router's
// mlp.gate.e_score_correction_bias (deepseek), none in Qwen3-MoE's. Returns how many HF tensors
// the parameter is: n_experts for a stacked one, 1, or 0 (the bias HF has not); -1: not the
// MoE layer's.
int moe_hf_name(const char *name, int n_experts, int expert, bool deepseek, char *out,
                size_t n);
// Parameters moe_layer_init adds (for the table's capacity).
int moe_param_count(const MoeArgs *args);
void moe_layer_free(MoeLayer *m);
// The layer's parameters (moe_param_count of them) into out, for a parallelize plan.
#define MOE_MAX_PARAMS 8
int moe_layer_params(const MoeLayer *m, Param *out[MOE_MAX_PARAMS]);
// The layer's Linears (the router's, the experts' grouped ones, the shared experts'), for
// Model.linears; returns how many.
#define MOE_MAX_LINEARS 7
int moe_layer_linears(MoeLayer *m, Linear *out[MOE_MAX_LINEARS]);

// y (rows, D) += MoE(x (rows, D)); fills sv. Counts each expert's routed slots into
// s->expert_load's row m->index when set, and adds the balance loss to s->aux_loss (a forward,
// not a recompute). Under tp the rows are this rank's of B*T (the balance loss sums its
// sequences' statistics over the tp group). Training's blocks call it on their rows, KV-cache
// decoding (models/decoder/decode.c) on one token's row with B = T = 1.
void moe_forward(MoeLayer *m, StepCtx *s, MoeSaved *sv, const float *x, float *y, int rows);
// dx (rows, D) += d MoE / dx^T dy, and every parameter gradient += its part (all in this one
// call: a split backward takes the layer's gradients in its input part). sv: forward's.
void moe_backward(MoeLayer *m, StepCtx *s, const MoeSaved *sv, const float *x, const float *dy,
                  float *dx, int rows);
