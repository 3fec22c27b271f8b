"""`titan --estimate` for a Llama 3 flavor under FSDP x TP, against closed forms.

    estimate_ref.py FLAVOR WORLD TP SEQ_LEN LOCAL_BATCH ESTIMATE_FILE

Reads the flavor's dims from models/llama3/args.c (its FLAVORS table), checks that they give
Meta's published parameter count, then derives from them, independently of titan's code, the
bytes per rank of the params, grads, optimizer and comm arenas and the FLOPs per step that
ESTIMATE_FILE (titan's output) must print. The layout is the shipped configs': dp_shard =
WORLD / TP, FSDP's default resharding (every unit but the last, the head, frees its gathered
weights after forward), fp32 params and reductions, the weights all-gathered in bf16 (the
configs' default training.mixed_precision_param). Exits 1 with each difference.

Per rank, in floats (each arena allocation rounded up to 64 bytes):
  tp:        wq, wk, wv, w1, w3 and the two vocab matrices cut along their rows, wo and w2
             along their columns, the norms whole;
  fsdp:      every tp-local tensor cut into dp row blocks of ceil(rows / dp) rows (the last
             ranks padded); one unit per block (embedding, each layer, head);
  params  =  the shard (sum over tensors of ceil(rows / dp) * row_numel) + the largest
             resharded unit gathered + the head gathered (kept from forward to backward),
             the two parts also printed apart (its "shards" and "unsharded" rows);
  grads   =  the shard + the largest unit gathered (backward's full grads);
  optimizer = AdamW's two moments of the shard;
  comm    =  all-gather receive and reduce-scatter send buffers of dp x the largest unit
             shard, and a reduce-scatter receive buffer of one; and in bf16 (half a float
             each) the all-gather's send buffer of one and receive buffer of dp;
  dtypes  =  each arena row's bytes by dtype: params, grads and optimizer all fp32, comm its
             fp32 and bf16 buffers above; every row's parts sum to its bytes;
  total   =  the sum of the five arenas (activations included, not derived here);
  FLOPs   =  torchtitan's (6 N + 12 L H Q T) per token, N without the embedding, times the
             rank's tokens, over tp.
"""
import math
import re
import sys

PUBLISHED = {"8B": 8.03e9, "70B": 70.6e9, "405B": 405.9e9}  # Meta's model cards
ALIGN = 64


def flavor_dims(name):
    text = open("../../models/llama3/args.c").read()
    m = re.search(r'\{"%s", ([^}]*)\}' % re.escape(name), text)
    if not m:
        sys.exit(f"no flavor {name} in models/llama3/args.c")
    f = [x.strip() for x in m.group(1).split(",")]
    dim, layers, heads, kv_heads, vocab, multiple_of = (int(x) for x in f[:6])
    multiplier = float(f[6])
    hidden = int(2 * 4 * dim / 3)
    if multiplier > 0:
        hidden = int(multiplier * hidden)
    hidden = multiple_of * math.ceil(hidden / multiple_of)
    return dict(dim=dim, layers=layers, heads=heads, kv=kv_heads or heads,
                vocab=vocab or 128256, hidden=hidden)


def units(d, tp):
    """Each unit's tensors as (tp-local rows, row numel)."""
    dim, hd = d["dim"], d["dim"] // d["heads"]
    emb = [(d["vocab"] // tp, dim)]
    layer = [(d["heads"] * hd // tp, dim), (d["kv"] * hd // tp, dim), (d["kv"] * hd // tp, dim),
             (dim, d["heads"] * hd // tp), (d["hidden"] // tp, dim), (dim, d["hidden"] // tp),
             (d["hidden"] // tp, dim), (dim, 1), (dim, 1)]
    head = [(dim, 1), (d["vocab"] // tp, dim)]
    return [emb] + [layer] * d["layers"] + [head]


def aligned(floats, bytes_each=4):
    return ALIGN * math.ceil(bytes_each * floats / ALIGN)


def main():
    flavor, world, tp, seq_len, batch, path = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
    d = flavor_dims(flavor)
    dp = world // tp
    us = units(d, 1)
    total = sum(r * n for u in us for r, n in u)
    if abs(total / PUBLISHED[flavor] - 1) > 0.005:
        sys.exit(f"{flavor}: {total} parameters, Meta publishes {PUBLISHED[flavor]:.4g}")
    us = units(d, tp)
    full = [sum(r * n for r, n in u) for u in us]
    shard = [sum(math.ceil(r / dp) * n for r, n in u) for u in us]
    numel = sum(shard)
    fp32 = {
        "params": aligned(numel) + aligned(max(full[:-1]) + full[-1]),
        "shards": aligned(numel),  # the params row's two parts
        "unsharded": aligned(max(full[:-1]) + full[-1]),
        "grads": aligned(numel) + aligned(max(full)),
        "optimizer": 2 * aligned(numel),
        "comm": 2 * aligned(dp * max(shard)) + aligned(max(shard)),
    }
    want_dtypes = {k: {"fp32": v} for k, v in fp32.items()}
    want_dtypes["comm"]["bf16"] = aligned(max(shard), 2) + aligned(dp * max(shard), 2)
    want = {k: sum(parts.values()) for k, parts in want_dtypes.items()}
    n_no_embedding = total - d["vocab"] * d["dim"]
    head_dim = d["dim"] // d["heads"]
    per_token = 6 * n_no_embedding + 12 * d["layers"] * d["heads"] * head_dim * seq_len
    want_flops = per_token * batch * seq_len / tp

    lines = open(path).read().splitlines()
    rows = [l.split(None, 3) for l in lines
            if l.startswith("  ") and len(l.split()) >= 3 and l.split()[1].isdigit()]
    got = {r[0]: int(r[1]) for r in rows}
    dtypes = {r[0]: {d: int(n) for d, n in (p.split() for p in r[3].split(", "))}
              for r in rows if len(r) == 4}  # "fp32 123, bf16 45": the arena rows' dtypes
    m = re.search(r"FLOPs per step per rank: (\S+)", "\n".join(lines))
    errors = [f"{k}: titan {got.get(k)}, closed form {v}"
              for k, v in want.items() if got.get(k) != v]
    errors += [f"{k} by dtype: titan {dtypes.get(k)}, closed form {v}"
               for k, v in want_dtypes.items() if dtypes.get(k) != v]
    errors += [f"{k}: its dtypes {parts} do not sum to {got[k]}"
               for k, parts in dtypes.items() if sum(parts.values()) != got[k]]
    arenas = ("params", "grads", "optimizer", "activations", "comm")
    if got.get("total") != sum(got.get(k, 0) for k in arenas):
        errors.append(f"total {got.get('total')} is not the sum of the arenas")
    if not m or abs(float(m.group(1)) / want_flops - 1) > 1e-3:
        errors.append(f"FLOPs per step per rank: titan {m and m.group(1)}, "
                      f"closed form {want_flops:.4g}")
    if errors:
        sys.exit(f"{flavor} on {world} ranks (tp {tp}): " + "; ".join(errors))
    print(f"ok: {flavor} on {world} ranks (dp_shard {dp} x tp {tp}): {total / 1e9:.2f}e9 params; "
          f"params, grads, optimizer and comm arenas (and their dtypes) and FLOPs equal the "
          f"closed forms")


main()
