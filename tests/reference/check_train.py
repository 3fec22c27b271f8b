"""Trains the PyTorch reference from titan's seed checkpoint and compares titan's metrics.

usage: /usr/bin/python3 tests/reference/check_train.py SEED_CKPT.h5 METRICS.jsonl
           [--steps N] [--data PATH] [--dtype float32|float64] [--tolerance X]

The config (titan's resolved YAML) and model args come from the checkpoint's attributes; the
data from training.dataset_path (relative paths resolve against the current directory, titan's
repository root) unless --data is given. The reference trains in fp32, titan's own precision,
with torch.optim.AdamW, torch.nn.utils.clip_grad_norm_ and torchtitan's LR lambda through
LambdaLR, as torchtitan's train loop does; under optimizer.name Muon, the matrices
optimizer.muon_pattern names take the Muon update below (written from Jordan et al.'s published
algorithm, as torch.optim.Muon runs it, but in the reference's dtype: --dtype float64 makes the
whole reference float64) and the rest AdamW. A MoE model adds its layers' balance loss to the
objective (model.moe_aux_loss_alpha; logged apart as aux_loss) and moves its expert biases
after clipping, before the optimizer step, by the step's expert load summed over the
microbatches (model.moe_load_balance_coeff). Under model.converters [lora] the reference's
Linears are llama_ref's LoRALinear (the paper's formula; lora.dropout drawing titan's
elements) and only the adapters train. Every
step titan logged is compared: loss,
grad_norm and aux_loss within 1e-4 relative, lr within 1e-6 relative. Exit 1 on failure.

Under semi_sync.method diloco or streaming_diloco the reference trains one model per replica
group (parallelism.data_parallel_replicate_degree), each on its rows of the global batch with
its own optimizer, and syncs them as DiLoCo does (train_semi_sync below, written from Douillard
et al. and TorchFT's local_sgd.DiLoCo); titan's loss is then the groups' mean and its grad_norm
group 0's.
"""
import argparse
import json
import math
import os
import re
import sys

import h5py
import numpy as np
import torch
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402

LOSS_TOLERANCE = 1e-4
GRAD_NORM_TOLERANCE = 1e-4
LR_TOLERANCE = 1e-6


def newton_schulz(g, steps, eps=1e-7):
    """g's orthogonalization: `steps` of the quintic X = a X + (b A + c A^2) X, A = X X^T, on
    X = g / ||g||_F in its wide orientation (Jordan et al.'s coefficients)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    tall = g.shape[0] > g.shape[1]
    x = g.T if tall else g
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


class MuonAndAdamW(torch.optim.Optimizer):
    """Muon for the first param group's matrices (a 3-D stack: one per expert), the inner
    AdamW for its groups, which this optimizer's param_groups share (LambdaLR sets both)."""

    def __init__(self, matrices, adamw, opt_cfg):
        super().__init__(matrices, dict(lr=float(opt_cfg["lr"]),
                                        weight_decay=float(opt_cfg["weight_decay"])))
        self.adamw, self.momentum = adamw, float(opt_cfg["momentum"])
        self.nesterov, self.ns_steps = bool(opt_cfg["nesterov"]), int(opt_cfg["ns_steps"])
        self.rms = opt_cfg["adjust_lr_fn"] == "match_rms_adamw"
        self.param_groups += adamw.param_groups

    @torch.no_grad()
    def step(self):
        group = self.param_groups[0]
        for p in group["params"]:
            buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
            buf.lerp_(p.grad, 1 - self.momentum)
            update = p.grad.lerp(buf, self.momentum) if self.nesterov else buf
            rows, cols = p.shape[-2:]
            ortho = torch.stack([newton_schulz(u, self.ns_steps)
                                 for u in update.reshape(-1, rows, cols)]).reshape(p.shape)
            ratio = 0.2 * math.sqrt(max(rows, cols)) if self.rms else math.sqrt(max(1, rows / cols))
            p.mul_(1 - group["lr"] * group["weight_decay"])
            p.add_(ortho, alpha=-group["lr"] * ratio)
        self.adamw.step()


def build_optimizer(model, config, ckpt_path, start_step):
    """AdamW (or Muon and AdamW) + LambdaLR positioned after `start_step` updates (moments
    restored if saved)."""
    opt_cfg, training = config["optimizer"], config["training"]
    muon = opt_cfg["name"] == "Muon"
    pattern = re.compile(opt_cfg["muon_pattern"])
    trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    is_muon = {name: muon and bool(pattern.search(name)) for name, _ in trained}
    adamw = torch.optim.AdamW(
        [p for name, p in trained if not is_muon[name]],
        lr=float(opt_cfg["lr"]), eps=float(opt_cfg["eps"]),
        betas=(float(opt_cfg["beta1"]), float(opt_cfg["beta2"])),
        weight_decay=float(opt_cfg["weight_decay"]))
    optimizer = adamw if not muon else MuonAndAdamW(
        [p for name, p in trained if is_muon[name]], adamw, opt_cfg)
    moments = llama_ref.load_optimizer_state(ckpt_path, model)
    if start_step > 0 and moments is None:
        raise SystemExit(f"{ckpt_path}: step {start_step} but no /optimizer state to resume")
    if moments is not None and start_step > 0:
        for name, param in trained:
            exp_avg, exp_avg_sq = moments[name]
            if is_muon[name]:  # titan keeps Muon's momentum as exp_avg
                optimizer.state[param] = {"momentum_buffer": exp_avg.clone()}
                continue
            adamw.state[param] = {"step": torch.tensor(float(start_step)),
                                  "exp_avg": exp_avg.clone(), "exp_avg_sq": exp_avg_sq.clone()}
    for group in optimizer.param_groups:
        group["initial_lr"] = group["lr"]
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, llama_ref.lr_lambda(config["lr_scheduler"], int(training["steps"])),
        last_epoch=start_step - 1)
    return optimizer, scheduler


def accumulation_steps(training):
    local, global_batch = int(training["local_batch_size"]), int(training["global_batch_size"])
    if global_batch == -1:
        return 1
    if global_batch % local:
        raise SystemExit(f"global_batch_size {global_batch} is not a multiple of "
                         f"local_batch_size {local}")
    return global_batch // local


def clip_grad_norm(params, max_norm):
    """torch.nn.utils.clip_grad_norm_'s rule (coefficient max_norm / (norm + 1e-6), clamped at
    1) with the norm summed in float64: torch 1.13's fp32 CPU norm of a large gradient is off by
    ~1e-4 relative (measured here against float64 on the embedding gradient), which is larger
    than the tolerance this check asserts."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
    coef = max_norm / (norm + 1e-6)
    if coef < 1:
        for g in grads:
            g.mul_(coef)
    return torch.tensor(norm)


def train_step(model, optimizer, scheduler, stream, step, training, bias_coeff):
    """One update; returns (mean microbatch loss, pre-clip grad norm, lr used, mean microbatch
    balance loss or None)."""
    accum = accumulation_steps(training)
    batch, seqlen = int(training["local_batch_size"]), int(training["seq_len"])
    optimizer.zero_grad(set_to_none=True)
    losses, aux_losses = [], []
    key = llama_ref.rng_key(int(training["seed"]), "lora dropout")
    for micro in range(accum):
        model.dropout_seed = (key ^ (step << 20 | micro)) | 1  # titan's, for LoRA's dropout
        tokens = llama_ref.microbatch(stream, step, micro, accum, batch, seqlen)
        loss = model.objective(model(tokens[:, :-1]), tokens[:, 1:])
        aux = model.aux_loss()
        ((loss + aux) / accum).backward()
        losses.append(loss.item())
        aux_losses.append(float(aux))
    grad_norm = clip_grad_norm(model.parameters(), float(training["max_norm"]))
    lr = optimizer.param_groups[0]["lr"]
    for moe in model.moe_layers():
        if moe.expert_bias_E is not None:
            moe.update_expert_bias(bias_coeff)
    optimizer.step()
    scheduler.step()
    aux = sum(aux_losses) / accum if any(m.aux_loss_alpha for m in model.moe_layers()) else None
    return sum(losses) / accum, grad_norm.item(), lr, aux


def train(ckpt_path, steps, data_path, dtype):
    """Reference metrics {step: (loss, grad_norm, lr, aux_loss)} for `steps` updates after the
    checkpoint."""
    model, _, config = llama_ref.load_checkpoint(ckpt_path, dtype)
    bias_coeff = model.configure_moe(config["model"])
    training = config["training"]
    stream = llama_ref.read_tokens(data_path or training["dataset_path"])
    start = llama_ref.checkpoint_step(ckpt_path)
    optimizer, scheduler = build_optimizer(model, config, ckpt_path, start)
    steps = int(training["steps"]) if steps is None else steps
    return {s: train_step(model, optimizer, scheduler, stream, s, training, bias_coeff)
            for s in range(start + 1, start + steps + 1)}


def fragment_of(name, n_layers, fragments):
    """Streaming DiLoCo's fragment of a parameter: the embedding, each layer, and the final
    norm with the output (a unit each, as torchtitan's fragment split weighs them) in equal
    runs."""
    match = re.match(r"layers\.(\d+)\.", name)
    unit = 1 + int(match.group(1)) if match else 0 if name.startswith("tok_embeddings") else n_layers + 1
    return unit * fragments // (n_layers + 2)


def train_semi_sync(ckpt_path, steps, data_path, dtype):
    """DiLoCo over R replica groups from the seed checkpoint: each group takes inner steps (its
    AdamW, its rows: group r's are rows [r B/R, (r+1) B/R) of each step's global batch of B);
    every sync_steps / F steps one fragment f (in turn) syncs: delta = outer - local averaged over
    the groups (taken fragment_sync_delay steps before it is used), the outer SGD (torch.optim.SGD
    semantics: momentum = mu momentum + delta, Nesterov's delta + mu momentum) steps the outer
    weights, and each group's weights become outer + alpha (local - outer)."""
    model, args, config = llama_ref.load_checkpoint(ckpt_path, dtype)
    if model.moe_layers():
        raise SystemExit("the semi-sync reference covers dense models (the MoE expert bias "
                         "is a buffer every group shares)")
    training, sync = config["training"], config["semi_sync"]
    replicas = int(config["parallelism"]["data_parallel_replicate_degree"])
    if int(training["global_batch_size"]) != -1:
        raise SystemExit("the semi-sync reference takes one microbatch a step "
                         "(training.global_batch_size -1)")
    stream = llama_ref.read_tokens(data_path or training["dataset_path"])
    start = llama_ref.checkpoint_step(ckpt_path)
    if start != 0:
        raise SystemExit("the semi-sync reference starts from a seed checkpoint (step 0)")
    groups = []
    for _ in range(replicas):
        copy, _, _ = llama_ref.load_checkpoint(ckpt_path, dtype)
        optimizer, scheduler = build_optimizer(copy, config, ckpt_path, 0)
        groups.append((copy, optimizer, scheduler))
    fragments, delay = int(sync["num_fragments"]), int(sync["fragment_sync_delay"])
    period = int(sync["sync_steps"]) // fragments
    lr, mu = float(sync["outer_lr"]), float(sync["outer_momentum"])
    nesterov, alpha = bool(sync["outer_nesterov"]), float(sync["fragment_update_alpha"])
    outer = {name: p.detach().clone() for name, p in model.named_parameters()}
    momentum = {name: torch.zeros_like(p) for name, p in outer.items()}
    delta = {}
    rows = int(training["local_batch_size"]) * int(config["parallelism"]["data_parallel_shard_degree"])
    seqlen = int(training["seq_len"])
    metrics = {}
    for step in range(1, int(training["steps"] if steps is None else steps) + 1):
        results = []
        for r, (copy, optimizer, scheduler) in enumerate(groups):
            optimizer.zero_grad(set_to_none=True)
            first = ((step - 1) * replicas + r) * rows
            tokens = torch.from_numpy(np.stack([llama_ref.window(stream, first + i, seqlen)
                                                for i in range(rows)]))
            loss = copy.objective(copy(tokens[:, :-1]), tokens[:, 1:])
            loss.backward()
            grad_norm = clip_grad_norm(copy.parameters(), float(training["max_norm"]))
            lr_used = optimizer.param_groups[0]["lr"]
            optimizer.step()
            scheduler.step()
            results.append((loss.item(), grad_norm.item(), lr_used))
        into = step % period
        with torch.no_grad():
            if into == (period - delay) % period:  # the fragment's all-reduce starts
                f = ((step - into + (period if into else 0)) // period - 1) % fragments
                locals_ = [dict(copy.named_parameters()) for copy, _, _ in groups]
                delta = {name: sum(outer[name] - l[name] for l in locals_) / replicas
                         for name in outer if fragment_of(name, args.n_layers, fragments) == f}
            if into == 0:  # its outer step
                for name, d in delta.items():
                    momentum[name].mul_(mu).add_(d)
                    update = d + mu * momentum[name] if nesterov else momentum[name]
                    outer[name] -= lr * update
                    for copy, _, _ in groups:
                        local = dict(copy.named_parameters())[name]
                        local.copy_(outer[name] + alpha * (local - outer[name]))
                delta = {}
        metrics[step] = (sum(x[0] for x in results) / replicas, results[0][1], results[0][2], None)
    return metrics


def read_metrics(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {int(r["step"]): (float(r["loss"]), float(r["grad_norm"]), float(r["lr"]),
                             float(r["aux_loss"]) if "aux_loss" in r else None) for r in rows}


def rel(a, b):
    return llama_ref.relative_error([a], [b])


def compare(titan, torch_metrics):
    """Prints the table; returns whether every step titan logged is within the bounds."""
    with_aux = any(m[3] is not None for m in torch_metrics.values())
    print(f"{'step':>5} | {'titan loss':>12} | {'torch loss':>12} | {'rel err':>9} | "
          f"{'gnorm rel':>9} | {'lr rel':>9}" + (f" | {'aux rel':>9}" if with_aux else ""))
    ok, compared = True, 0
    for step, (t_loss, t_gnorm, t_lr, t_aux) in sorted(torch_metrics.items()):
        if step not in titan:
            print(f"{step:5d} | {'-':>12} | {t_loss:12.7f} | (not logged by titan)")
            continue
        loss, gnorm, lr, aux = titan[step]
        errs = rel(loss, t_loss), rel(gnorm, t_gnorm), rel(lr, t_lr)
        good = (errs[0] < LOSS_TOLERANCE and errs[1] < GRAD_NORM_TOLERANCE
                and errs[2] < LR_TOLERANCE)
        row = f"{step:5d} | {loss:12.7f} | {t_loss:12.7f} | {errs[0]:9.2e} | {errs[1]:9.2e} | " \
              f"{errs[2]:9.2e}"
        if with_aux:  # titan must log it exactly when the reference has one
            aux_err = rel(aux, t_aux) if aux is not None else math.inf
            good &= aux_err < LOSS_TOLERANCE
            row += f" | {aux_err:9.2e}"
        elif aux is not None:
            good = False
            row += " | aux_loss logged without a balance loss"
        print(row + ('' if good else '  FAIL'))
        ok &= good
        compared += 1
    if compared == 0:
        print("FAIL: titan logged none of the steps the reference trained")
        return False
    print("PASS" if ok else "FAIL", f"({compared} steps; bounds: loss{', aux_loss' * with_aux} "
          f"{LOSS_TOLERANCE:g}, grad_norm {GRAD_NORM_TOLERANCE:g}, lr {LR_TOLERANCE:g} relative)")
    return ok


def main():
    global LOSS_TOLERANCE, GRAD_NORM_TOLERANCE
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("seed_ckpt")
    parser.add_argument("metrics")
    parser.add_argument("--steps", type=int, help="updates to train (default: training.steps)")
    parser.add_argument("--data", help="token shard or directory (default: training.dataset_path)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                        help="the reference's (default: float32, titan's)")
    parser.add_argument("--tolerance", type=float, default=LOSS_TOLERANCE,
                        help=f"loss and grad_norm bound, relative (default: {LOSS_TOLERANCE:g})")
    args = parser.parse_args()
    LOSS_TOLERANCE = GRAD_NORM_TOLERANCE = args.tolerance
    titan = read_metrics(args.metrics)
    dtype = getattr(torch, args.dtype)
    with h5py.File(args.seed_ckpt, "r") as f:
        config = yaml.safe_load(llama_ref.attr_text(f.attrs["config"]))
    semi_sync = config.get("semi_sync", {}).get("method", "none") != "none"
    reference = (train_semi_sync if semi_sync else train)(args.seed_ckpt, args.steps, args.data,
                                                          dtype)
    return 0 if compare(titan, reference) else 1


if __name__ == "__main__":
    sys.exit(main())
