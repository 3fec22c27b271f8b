// LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"), as torchtitan's
// LoRAConverter (model.converters: [lora], the lora.* keys): each targeted Linear y = x W^T
// becomes y = x W^T + (alpha / rank) (x A^T) B^T with A (rank, in) and B (out, rank) trained,
// and every other parameter of the model frozen (core/param.h's Param.frozen). The adapters
// are parameters of their own, named after their Linear's module as torchtitan names them
// ("layers.0.attention.wq.lora_a.weight", ".lora_b.weight"), laid out in the block of their
// Linear: the parallelisms, the optimizer and checkpoints take them as any parameter. The
// math is models/linear.c's. QLoRA (lora.quantize_base): the adapted Linears' weights are then
// held as NF4 (core/param.h's Param.nf4), dequantized at each GEMM.
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "core/config.h"
#include "core/param.h"
#include "models/model.h"

typedef struct Tp Tp;  // parallel/tp.h

// Whether lora adapts the Linear `module` ("layers.0.attention.wq"): target_modules empty
// (every Linear), or an entry equal to module or to its end after a '.' (PEFT's rule, so
// torchtitan's last-segment names, "wq", match as they do there).
bool lora_targets(const LoraSection *lora, const char *module);

// The build's, right after it adds the weight (out, in) of the Linear `module`: that Linear's
// adapters when lora (NULL: no LoRA) targets it. A is initialised as nn.Linear's default
// (kaiming_uniform with a = sqrt(5), torchtitan's lora_a), B zero (so the adapted model starts
// as its base). Returns how many parameters it added (0 or 2).
int lora_add_adapters(ParamTable *t, const LoraSection *lora, const char *module, int64_t out,
                      int64_t in);
// The build's Linear weight prefix + module + ".weight" (out, in), initialised as init and std
// say, then its adapters (lora_add_adapters). Returns the weight.
Param *lora_add_linear(ParamTable *t, const LoraSection *lora, ParamInit init, double std,
                       int64_t out, int64_t in, const char *prefix, const char *module);
// Whether parameter `name` is an adapter ("<module>.lora_a.weight" or ".lora_b.weight"); then
// module gets "<module>.weight", its Linear's weight, and *which 'a' or 'b' (either may be
// NULL).
bool lora_adapter_of(const char *name, char *module, size_t n, char *which);

// The converter, after the build: attaches each Linear's adapters (found by name) and freezes
// every other parameter (c's lora section). die_user naming the key when an entry of
// lora.target_modules names no Linear of the model.
void model_convert_lora(Model *m, const Config *c);

// Tensor parallel (after the model's plan placed the weights): the adapters follow their
// weight as torchtitan's _lora_adapter_sharding: a column-parallel weight's B is cut as it is,
// A replicated (its gradient a partial sum over the group: the rank's output columns' share);
// a row-parallel weight's A is cut along its input as it is, B replicated (its gradient a
// partial sum, the low-rank product being one); a replicated weight's adapters replicated as
// it is.
void lora_parallelize_tp(Model *m, const Tp *tp);

// The log line of the adapted Linears and the trainable parameters' share.
void lora_log(const Model *m, const LoraSection *lora);

// Generation and export from a LoRA run's checkpoint at path (c: its config): each weight of t
// (a model built without adapters, whole tensors, loaded from the checkpoint's group, "/model/"
// or "/ema/") that has adapters there becomes W + (alpha / rank) B A, PEFT's merge_and_unload,
// summed in double. Returns how many it merged (0 without LoRA). die_user for an adapted tied
// output projection, which cannot merge without changing the embedding.
int lora_merge(const char *path, const Config *c, ParamTable *t, const char *group);
