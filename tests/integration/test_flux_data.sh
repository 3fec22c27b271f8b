#!/usr/bin/env bash
# FLUX data: scripts/flux_preprocess.py --digits writes the shards docs/flux.md describes (checked
# with h5py against scikit-learn's digits and an independent recomputation of the stand-in encoder),
# twice the same; titan's reader (build/tests/flux_shards_info) sees the same examples; a shard with
# a missing encoding, mismatched shapes or an image size the patch does not divide is one line and
# exit 2; so is the real-image path without its packages.
source "$(dirname "$0")/lib.sh"
INFO=build/tests/flux_shards_info
[ -x $INFO ] || fail "$INFO is not built (make $INFO)"

$PY scripts/flux_preprocess.py --digits --out "$SCRATCH/a" --shard-size 500 >/dev/null
$PY scripts/flux_preprocess.py --digits --out "$SCRATCH/b" --shard-size 500 >/dev/null
$INFO "$SCRATCH/a" 2 0 600 1796 >"$SCRATCH/info.txt"

$PY - "$SCRATCH" <<'EOF'
import glob, hashlib, sys
import h5py, numpy as np
from sklearn.datasets import load_digits

scratch = sys.argv[1]
def shards(run):
    return sorted(glob.glob(f"{scratch}/{run}/*.h5"))

names = [p.split("/")[-1] for p in shards("a")]
assert names == [f"digits-{k:05d}.h5" for k in range(4)], names
data = {k: [] for k in ("latents", "t5_encodings", "clip_encodings", "labels", "captions")}
for pa, pb in zip(shards("a"), shards("b")):
    with h5py.File(pa) as a, h5py.File(pb) as b:
        assert sorted(a.keys()) == sorted(data), list(a.keys())
        for k in data:  # two runs: identical datasets and attributes
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k][()], b[k][()]), (pa, k)
            data[k].append(a[k][()])
        assert dict(a.attrs).keys() == dict(b.attrs).keys()
        for k in a.attrs:
            assert np.array_equal(a.attrs[k], b.attrs[k]), k
        assert list(a.attrs["image_size"]) == [16, 16]
        for k in ("latents", "t5_encodings", "clip_encodings"):
            assert a[k].dtype == np.float32, (k, a[k].dtype)
        assert a["labels"].dtype == np.int32
assert [len(x) for x in data["labels"]] == [500, 500, 500, 297]
lat, t5, clip = (np.concatenate(data[k]) for k in ("latents", "t5_encodings", "clip_encodings"))
labels = np.concatenate(data["labels"])
captions = [c.decode() for x in data["captions"] for c in x]
assert lat.shape == (1797, 1, 16, 16) and t5.shape == (1797, 8, 64) and clip.shape == (1797, 32)

d = load_digits()
assert np.array_equal(labels, d.target)
assert captions == [f"a handwritten digit {n}" for n in d.target]
assert lat.min() == -1 and lat.max() == 1
for y in range(16):  # nearest 2x: pixel (y, x) is source pixel (y // 2, x // 2), v / 8 - 1
    for x in range(16):
        assert np.array_equal(lat[:, 0, y, x], (d.images[:, y // 2, x // 2] / 8 - 1).astype(np.float32))

# The stand-in, recomputed from its definition in docs/flux.md: words -> sha256 -> RandomState.
def word(w):
    seed = int.from_bytes(hashlib.sha256(w.encode()).digest()[:4], "little")
    return np.random.RandomState(seed).standard_normal(64).astype(np.float32)
P = np.random.RandomState(20240).standard_normal((64, 32)) / 8
for i in (0, 5, 1796):
    words = captions[i].split()
    want = np.zeros((8, 64), np.float32)
    want[:4] = [word(w) for w in words]
    assert np.array_equal(t5[i], want), i
    assert np.allclose(clip[i], want[:4].astype(np.float64).mean(0) @ P, rtol=0, atol=1e-6), i
for n in range(10):  # one encoding per caption, distinct per digit
    same = t5[labels == n]
    assert (same == same[0]).all() and (clip[labels == n] == clip[labels == n][0]).all()
assert len({t5[labels == n][0][3].tobytes() for n in range(10)}) == 10

# titan's reader: the same sizes, attributes and examples.
info = open(f"{scratch}/info.txt").read().splitlines()
assert info[0] == ("n=1797 shards=4 C=1 H=16 W=16 L=8 D_t5=64 D_clip=32 image_size=16x16 "
                   "labels=1 captions=1"), info[0]
with h5py.File(shards("a")[0]) as f:
    assert info[1:4] == [f"{k}={f.attrs[k]}" for k in ("t5_encoder", "clip_encoder", "autoencoder")]
for line in info[4:]:
    head, sums = line.split("|")
    i, label, caption = head.split(" ", 2)
    i = int(i)
    assert int(label) == labels[i] and caption == captions[i], line
    want = [lat[i].sum(dtype=np.float64), t5[i].sum(dtype=np.float64), clip[i].sum(dtype=np.float64)]
    assert np.allclose([float(s) for s in sums.split()], want, rtol=1e-7, atol=1e-6), (line, want)
print("ok: digits shards (4 shards, 1797 examples), stand-in encodings, determinism, titan's reader")
EOF

# Bad shards: the reader's one line, exit 2.
mkdir "$SCRATCH/noclip" "$SCRATCH/shape"
cp "$SCRATCH/a/digits-00000.h5" "$SCRATCH/a/digits-00001.h5" "$SCRATCH/noclip/"
cp "$SCRATCH/a/digits-00000.h5" "$SCRATCH/a/digits-00001.h5" "$SCRATCH/shape/"
$PY - "$SCRATCH" <<'EOF'
import sys, h5py
with h5py.File(f"{sys.argv[1]}/noclip/digits-00001.h5", "a") as f:
    del f["clip_encodings"]
with h5py.File(f"{sys.argv[1]}/shape/digits-00001.h5", "a") as f:
    t5 = f["t5_encodings"][()]
    del f["t5_encodings"]
    f["t5_encodings"] = t5[:, :, :32]
EOF
expect_user_error "^titan: error: flux shard .*/noclip/digits-00001.h5: no dataset 'clip_encodings'" \
  $INFO "$SCRATCH/noclip" 2
expect_user_error "^titan: error: flux shard .*/shape/digits-00001.h5: dataset 't5_encodings' has shape \(500, 8, 32\), but the first shard .*/shape/digits-00000.h5 has \(N, 8, 64\)$" \
  $INFO "$SCRATCH/shape" 2
expect_user_error "^titan: error: flux shard .*/a/digits-00000.h5: dataset 'latents' holds 16x16 images, not divisible by the model's patch size 3$" \
  $INFO "$SCRATCH/a" 3

# Hostile shapes (issue 30): chunked datasets cost nothing until written, so a small file can
# claim any size. Each is refused in one line before anything is sized by it, by the reader
# and by a training run: a dimension past its limit, an example past 2^30 elements, an
# image_size HDF5 would clip to INT_MAX, and a shape within the limits whose microbatch does
# not fit the host's memory.
$PY - "$SCRATCH" <<'EOF'
import os, sys, h5py
def shard(name, latents=(64, 1, 16, 16), t5=(64, 8, 64), clip=(64, 32), image_size=(16, 16)):
    os.makedirs(f"{sys.argv[1]}/{name}")
    with h5py.File(f"{sys.argv[1]}/{name}/x.h5", "w") as f:
        for key, shape in (("latents", latents), ("t5_encodings", t5), ("clip_encodings", clip)):
            f.create_dataset(key, shape=shape, dtype="f4", chunks=(1,) * len(shape))
        for key in ("t5_encoder", "clip_encoder", "autoencoder"):
            f.attrs[key] = "x"
        f.attrs["image_size"] = image_size
shard("wraps", latents=(64, 2, 2**30, 2**26))  # the probe's: rows*C*H*W wrapped size_t
shard("int", latents=(64, 1, 2**31 - 2, 2**31 - 2))  # flux_img_tokens overflowed an int
shard("example", latents=(4, 1024, 2048, 2048))
shard("t5", t5=(64, 2**20, 64))
shard("image_size", image_size=(2**40, 16))
shard("host", latents=(64, 16, 8192, 8192))  # 4 GiB per example and buffer
EOF
F=$SCRATCH/
expect_user_error "^titan: error: flux shard ${F}wraps/x.h5: dataset 'latents' \(N, C, H, W\) has shape \(64, 2, 1073741824, 67108864\): H must be 1 to 65536$" \
  $INFO "$SCRATCH/wraps" 2
expect_user_error "^titan: error: flux shard ${F}int/x.h5: dataset 'latents' \(N, C, H, W\) has shape \(64, 1, 2147483646, 2147483646\): H must be 1 to 65536$" \
  $INFO "$SCRATCH/int" 2
expect_user_error "^titan: error: flux shard ${F}example/x.h5: dataset 'latents' has shape \(4, 1024, 2048, 2048\): 4294967296 elements per example, more than the limit of 2\^30$" \
  $INFO "$SCRATCH/example" 2
expect_user_error "^titan: error: flux shard ${F}t5/x.h5: dataset 't5_encodings' \(N, L, D_t5\) has shape \(64, 1048576, 64\): L must be 1 to 65536$" \
  $INFO "$SCRATCH/t5" 2
expect_user_error "^titan: error: flux shard ${F}image_size/x.h5: attribute 'image_size' is not 2 integers \(height, width\) from 1 to 2\^20$" \
  $INFO "$SCRATCH/image_size" 2
FLUX=($TITAN --config configs/flux_digits.yaml --training.local_batch_size 8 --training.steps 2)
expect_user_error "^titan: error: flux shard ${F}wraps/x.h5: dataset 'latents' .*: H must be 1 to 65536$" \
  "${FLUX[@]}" --training.dataset_path "$SCRATCH/wraps" --job.dump_folder "$SCRATCH/out"
expect_user_error "^titan: error: flux dataset ${F}host: a microbatch of 8 examples \(latents 16x8192x8192, T5 8x64, CLIP 32\) needs 128\.00 GiB of host memory for its inputs, but [0-9.]+ GiB is free$" \
  "${FLUX[@]}" --training.dataset_path "$SCRATCH/host" --job.dump_folder "$SCRATCH/out"

# The script's own errors, and the real path where its packages or weights are missing.
expect_user_error "^flux_preprocess: give exactly one of --digits and --images DIR$" \
  $PY scripts/flux_preprocess.py --out "$SCRATCH/c"
printf 'x.png\ta caption\n' >"$SCRATCH/captions.txt"
touch "$SCRATCH/x.png"
expect_user_error "^flux_preprocess: (--images needs [a-z]+ \(pip install [a-z]+\), which is not installed|--t5 .*: no such folder of weights .*)$" \
  $PY scripts/flux_preprocess.py --out "$SCRATCH/c" --images "$SCRATCH" --captions "$SCRATCH/captions.txt" \
  --t5 "$SCRATCH/no-t5" --clip "$SCRATCH/no-clip" --ae "$SCRATCH/no-ae"
echo "PASS test_flux_data"
