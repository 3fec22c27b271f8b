// A MoE layer's tensors under Hugging Face's names (transformers' Qwen3MoeSparseMoeBlock, as
// Mixtral's and Qwen2-MoE's routed experts: one tensor per expert; DeepseekV3MoE's with its
// router's e_score_correction_bias and shared experts), as torchtitan's MoEStateDictAdapter
// splits and stacks them.
#include <stdio.h>
#include <string.h>

#include "models/moe/moe.h"

typedef struct {
    const char *titan, *hf;  // hf: a printf format with the expert's index when stacked
    int experts;             // 1: stacked (E HF tensors), 0: one tensor
} MoeName;

static const MoeName NAMES[] = {
    {"moe.router.gate.weight", "mlp.gate.weight", 0},
    {"moe.routed_experts.inner_experts.w1_EFD", "mlp.experts.%d.gate_proj.weight", 1},
    {"moe.routed_experts.inner_experts.w2_EDF", "mlp.experts.%d.down_proj.weight", 1},
    {"moe.routed_experts.inner_experts.w3_EFD", "mlp.experts.%d.up_proj.weight", 1},
    {"moe.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight", 0},
    {"moe.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight", 0},
    {"moe.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight", 0},
};

int moe_hf_name(const char *name, int n_experts, int expert, bool deepseek, char *out,
                size_t n) {
    if (!strcmp(name, "moe.expert_bias_E")) {
        if (!deepseek) return 0;  // Qwen3-MoE's router has no bias
        snprintf(out, n, "mlp.gate.e_score_correction_bias");
        return 1;
    }
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++) {
        if (strcmp(name, NAMES[i].titan) != 0) continue;
        snprintf(out, n, NAMES[i].hf, expert);
        return NAMES[i].experts ? n_experts : 1;
    }
    return -1;
}
