#!/usr/bin/env python3
"""Writes FLUX training data as cached-encoding HDF5 shards (the format of data/flux_shards.h).

Two sources:

  --digits   scikit-learn's bundled 8x8 handwritten digits (1797 images, no download), in pixel
             space, captioned "a handwritten digit N" and encoded by a small deterministic
             stand-in for T5 and CLIP (below). What the tests and the embedded default train on.
  --images DIR --captions FILE --t5 PATH --clip PATH --ae PATH
             real images through the real T5 encoder, CLIP text model and FLUX autoencoder
             (transformers, diffusers; their weights on disk). FILE has one line per image,
             "NAME<TAB>CAPTION", NAME relative to DIR.

The digits, exactly:
  latents   each 8x8 image (values 0..16) upscaled 2x by nearest neighbour (each pixel a 2x2
            block) to 16x16, then v / 8 - 1: float32 in [-1, 1], C = 1, so (N, 1, 16, 16).
  captions  "a handwritten digit N", N the label; labels int32 (N).
  T5 stand-in (L = 8, D_t5 = 64): the caption split on whitespace; word w becomes the vector
            numpy.random.RandomState(s).standard_normal(64) as float32, s = the first 4 bytes of
            sha256(w as UTF-8) read as a little-endian uint32; row k is word k's vector, rows
            past the last word are zero (the pad vector); a caption of more than 8 words is an
            error.
  CLIP stand-in (D_clip = 32): the mean of the caption's word vectors (float64), times the
            matrix RandomState(20240) .standard_normal((64, 32)) / sqrt(64), as float32.
RandomState is numpy's legacy generator, whose streams numpy keeps fixed across versions, so
the stand-in is the same function of the caption on any machine.

Shards are written to OUT/<prefix>-00000.h5, ... of at most --shard-size examples each, every
file first as NAME.tmp and then renamed. Errors are one line and exit 2.
"""
import argparse
import hashlib
import os
import sys

import numpy as np

T5_LENGTH, T5_DIM, CLIP_DIM = 8, 64, 32
CLIP_SEED = 20240
STANDIN_T5 = "titan stand-in T5: sha256(word) -> RandomState normal, L=8, D=64, zero pad"
STANDIN_CLIP = "titan stand-in CLIP: mean of the stand-in T5 word vectors @ RandomState(20240) " \
               "normal(64, 32) / 8"


def die(message):
    print(f"flux_preprocess: {message}", file=sys.stderr)
    sys.exit(2)


# ---- the stand-in text encoder ----

def word_vector(word):
    seed = int.from_bytes(hashlib.sha256(word.encode("utf-8")).digest()[:4], "little")
    return np.random.RandomState(seed).standard_normal(T5_DIM).astype(np.float32)


def standin_encode(caption, projection):
    words = caption.split()
    if not 1 <= len(words) <= T5_LENGTH:
        die(f"caption {caption!r} has {len(words)} words; the stand-in encodes 1 to {T5_LENGTH}")
    t5 = np.zeros((T5_LENGTH, T5_DIM), np.float32)
    for k, w in enumerate(words):
        t5[k] = word_vector(w)
    clip = (t5[: len(words)].astype(np.float64).mean(axis=0) @ projection).astype(np.float32)
    return t5, clip


def clip_projection():
    return np.random.RandomState(CLIP_SEED).standard_normal((T5_DIM, CLIP_DIM)) / np.sqrt(T5_DIM)


# ---- shards ----

class ShardWriter:
    """Collects examples and writes every shard_size of them as one shard."""

    def __init__(self, out, prefix, shard_size, attrs):
        import h5py  # noqa: F401 (fail here, before any work, if it is missing)
        os.makedirs(out, exist_ok=True)
        self.out, self.prefix, self.shard_size, self.attrs = out, prefix, shard_size, attrs
        self.rows, self.shards = [], 0

    def add(self, latent, t5, clip, caption, label=None):
        self.rows.append((latent, t5, clip, caption, label))
        if len(self.rows) == self.shard_size:
            self.flush()

    def flush(self):
        if not self.rows:
            return
        import h5py
        path = os.path.join(self.out, f"{self.prefix}-{self.shards:05d}.h5")
        latents, t5, clip, captions, labels = zip(*self.rows)
        with h5py.File(path + ".tmp", "w") as f:
            f.create_dataset("latents", data=np.stack(latents).astype(np.float32), track_times=False)
            f.create_dataset("t5_encodings", data=np.stack(t5).astype(np.float32), track_times=False)
            f.create_dataset("clip_encodings", data=np.stack(clip).astype(np.float32),
                             track_times=False)
            f.create_dataset("captions", data=list(captions), dtype=h5py.string_dtype(),
                             track_times=False)
            if labels[0] is not None:
                f.create_dataset("labels", data=np.array(labels, np.int32), track_times=False)
            for key, value in self.attrs.items():
                f.attrs[key] = value
        os.replace(path + ".tmp", path)
        print(f"wrote {path}: {len(self.rows)} examples")
        self.rows, self.shards = [], self.shards + 1


def digits(args):
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        die("--digits needs scikit-learn (Debian: apt-get install python3-sklearn)")
    d = load_digits()
    images = d.images.astype(np.float32)  # (1797, 8, 8), 0..16
    big = images.repeat(2, axis=1).repeat(2, axis=2)  # nearest 2x: (1797, 16, 16)
    latents = (big / 8.0 - 1.0)[:, None]  # (1797, 1, 16, 16) in [-1, 1]
    writer = ShardWriter(args.out, "digits", args.shard_size, {
        "t5_encoder": STANDIN_T5, "clip_encoder": STANDIN_CLIP,
        "autoencoder": "none (pixels: 8x8 digits upscaled 2x nearest, v/8 - 1)",
        "image_size": np.array([16, 16], np.int32), "source": "sklearn.datasets.load_digits"})
    projection, cache = clip_projection(), {}
    for latent, label in zip(latents, d.target):
        caption = f"a handwritten digit {int(label)}"
        if caption not in cache:
            cache[caption] = standin_encode(caption, projection)
        writer.add(latent, *cache[caption], caption, int(label))
    writer.flush()


# ---- real images through T5, CLIP and the FLUX autoencoder ----

def lazy_import(module, package):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        die(f"--images needs {package} (pip install {package}), which is not installed")


def weights_dir(path, flag):
    if not path or not os.path.isdir(path):
        die(f"{flag} {path}: no such folder of weights (--images needs the T5, CLIP and "
            "autoencoder weights on disk)")
    return path


def captions_read(path, images):
    pairs = []
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as e:
        die(f"cannot read --captions {path}: {e.strerror}")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        name, tab, caption = line.partition("\t")
        if not tab or not caption.strip():
            die(f"{path}:{number}: expected NAME<TAB>CAPTION")
        if not os.path.isfile(os.path.join(images, name)):
            die(f"{path}:{number}: no image {os.path.join(images, name)}")
        pairs.append((name, caption))
    if not pairs:
        die(f"--captions {path} lists no image")
    return pairs


def image_tensor(torch, Image, path, size):
    """The image resized (shorter side to size, bicubic), centre-cropped to size x size and
    scaled to [-1, 1]: (3, size, size)."""
    img = Image.open(path).convert("RGB")
    scale = size / min(img.size)
    img = img.resize((max(size, round(img.width * scale)), max(size, round(img.height * scale))),
                     Image.BICUBIC)
    left, top = (img.width - size) // 2, (img.height - size) // 2
    img = img.crop((left, top, left + size, top + size))
    x = torch.from_numpy(np.asarray(img, np.float32).copy()).permute(2, 0, 1)
    return x / 127.5 - 1.0


def images(args):
    torch = lazy_import("torch", "torch")
    Image = lazy_import("PIL.Image", "pillow")
    transformers = lazy_import("transformers", "transformers")
    diffusers = lazy_import("diffusers", "diffusers")
    t5_path, clip_path = weights_dir(args.t5, "--t5"), weights_dir(args.clip, "--clip")
    ae_path = weights_dir(args.ae, "--ae")
    pairs = captions_read(args.captions, args.images)
    dev = torch.device(args.device)
    t5_tok = transformers.T5TokenizerFast.from_pretrained(t5_path)
    t5 = transformers.T5EncoderModel.from_pretrained(t5_path).to(dev).eval()
    clip_tok = transformers.CLIPTokenizer.from_pretrained(clip_path)
    clip = transformers.CLIPTextModel.from_pretrained(clip_path).to(dev).eval()
    ae = diffusers.AutoencoderKL.from_pretrained(ae_path).to(dev).eval()
    name = lambda p: os.path.basename(os.path.normpath(p))  # noqa: E731
    writer = ShardWriter(args.out, "images", args.shard_size, {
        "t5_encoder": name(t5_path), "clip_encoder": name(clip_path), "autoencoder": name(ae_path),
        "image_size": np.array([args.image_size, args.image_size], np.int32),
        "source": os.path.abspath(args.images)})
    with torch.no_grad():
        for start in range(0, len(pairs), args.batch):
            batch = pairs[start:start + args.batch]
            caps = [c for _, c in batch]
            x = torch.stack([image_tensor(torch, Image, os.path.join(args.images, n),
                                          args.image_size) for n, _ in batch]).to(dev)
            # FLUX's latents: the posterior's mean, shifted and scaled as the FLUX pipeline does.
            z = ae.encode(x).latent_dist.mode()
            z = (z - ae.config.shift_factor) * ae.config.scaling_factor
            ids = t5_tok(caps, max_length=args.t5_length, padding="max_length", truncation=True,
                         return_tensors="pt").input_ids.to(dev)
            t5_out = t5(input_ids=ids).last_hidden_state
            ids = clip_tok(caps, max_length=77, padding="max_length", truncation=True,
                           return_tensors="pt").input_ids.to(dev)
            clip_out = clip(input_ids=ids).pooler_output
            for k, caption in enumerate(caps):
                writer.add(z[k].float().cpu().numpy(), t5_out[k].float().cpu().numpy(),
                           clip_out[k].float().cpu().numpy(), caption)
    writer.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the shards")
    p.add_argument("--shard-size", type=int, default=512, help="examples per shard")
    p.add_argument("--digits", action="store_true", help="the bundled 8x8 digits, stand-in text")
    p.add_argument("--images", help="folder of images (the real path)")
    p.add_argument("--captions", help="NAME<TAB>CAPTION per line, NAME relative to --images")
    p.add_argument("--t5", help="T5 encoder weights folder (e.g. google/t5-v1_1-xxl)")
    p.add_argument("--clip", help="CLIP text model folder (e.g. openai/clip-vit-large-patch14)")
    p.add_argument("--ae", help="FLUX autoencoder folder (FLUX.1-dev's vae/)")
    p.add_argument("--image-size", type=int, default=256, help="square image side in pixels")
    p.add_argument("--t5-length", type=int, default=256, help="T5 tokens (schnell 256, dev 512)")
    p.add_argument("--batch", type=int, default=8, help="images encoded at once")
    p.add_argument("--device", default="cpu", help="torch device for the encoders")
    args = p.parse_args()
    if args.shard_size < 1:
        die(f"--shard-size {args.shard_size}: must be at least 1")
    if args.digits == bool(args.images):
        die("give exactly one of --digits and --images DIR")
    if args.images and not args.captions:
        die("--images needs --captions FILE")
    if args.images and args.image_size % 16:
        die(f"--image-size {args.image_size}: must be a multiple of 16 (the autoencoder's 8x, "
            "then FLUX's 2x2 patches)")
    digits(args) if args.digits else images(args)


if __name__ == "__main__":
    main()
