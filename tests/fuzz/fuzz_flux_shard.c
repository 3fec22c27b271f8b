// libFuzzer target: the FLUX shard reader's checks (data/flux_shards.c) on the shapes and
// attributes a shard claims. The input is not an HDF5 file (fuzzing HDF5's own parser is
// HDF5's business): it is read as a description, and the target writes the shard it
// describes with HDF5, each dataset chunked and never written, so that any shape costs
// nothing, as in the hostile files of issue 30. Then flux_shards_try_open takes it; an
// accepted shard must have every size within the reader's limits, so that the products the
// loader and the model form from them fit their types.
//
// The description, little-endian, cycled when the input runs out: per dataset (latents, T5,
// CLIP) a byte of flags (bit 0: absent; bit 1: int32 instead of float32; bit 2: one rank
// fewer) and its dimensions as 8-byte values; then image_size as two 8-byte values.
#include <hdf5.h>
#include <stdint.h>

#include "data/flux_shards.h"
#include "tests/fuzz/fuzz_file.h"

typedef struct {
    const uint8_t *data;
    size_t size, at;
} Reader;

static uint64_t take(Reader *r, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)r->data[r->at++ % r->size] << (8 * i);
    return v;
}

// A dimension: mostly small (the 2 low bits pick the scale), sometimes huge.
static hsize_t dimension(Reader *r) {
    uint64_t v = take(r, 8);
    switch (v & 3) {
    case 0: return (v >> 2) % 65;
    case 1: return (v >> 2) % 70000;
    case 2: return (v >> 2) % ((uint64_t)1 << 32);
    default: return (v >> 2) % ((uint64_t)1 << 40);
    }
}

static bool shard_write(const char *path, Reader *r) {
    static const char *const names[] = {"latents", "t5_encodings", "clip_encodings"};
    static const int ranks[] = {4, 3, 2};
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return false;
    bool ok = true;
    hsize_t n = dimension(r) % 65;
    for (int d = 0; d < 3 && ok; d++) {
        uint8_t flags = (uint8_t)take(r, 1);
        int rank = ranks[d] - ((flags & 4) != 0);
        hsize_t dims[4] = {n}, chunk[4] = {1, 1, 1, 1};
        for (int k = 1; k < rank; k++) dims[k] = dimension(r);
        if (flags & 1) continue;
        for (int k = 0; k < rank; k++) if (dims[k] == 0) chunk[k] = 1;
        hid_t space = H5Screate_simple(rank, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
        ok = space >= 0 && dcpl >= 0 && H5Pset_chunk(dcpl, rank, chunk) >= 0;
        hid_t set = ok ? H5Dcreate2(f, names[d], flags & 2 ? H5T_STD_I32LE : H5T_IEEE_F32LE, space,
                                    H5P_DEFAULT, dcpl, H5P_DEFAULT)
                       : -1;
        ok = set >= 0;
        if (set >= 0) H5Dclose(set);
        if (dcpl >= 0) H5Pclose(dcpl);
        if (space >= 0) H5Sclose(space);
    }
    hid_t str = H5Tcopy(H5T_C_S1);
    H5Tset_size(str, H5T_VARIABLE);
    hid_t scalar = H5Screate(H5S_SCALAR);
    const char *value = "x";
    for (int a = 0; a < 3 && ok; a++) {
        static const char *const attrs[] = {"t5_encoder", "clip_encoder", "autoencoder"};
        hid_t attr = H5Acreate2(f, attrs[a], str, scalar, H5P_DEFAULT, H5P_DEFAULT);
        ok = attr >= 0 && H5Awrite(attr, str, &value) >= 0;
        if (attr >= 0) H5Aclose(attr);
    }
    hsize_t two = 2;
    int64_t size[2] = {(int64_t)take(r, 8), (int64_t)take(r, 8)};
    hid_t pair = H5Screate_simple(1, &two, NULL);
    hid_t attr = ok ? H5Acreate2(f, "image_size", H5T_STD_I64LE, pair, H5P_DEFAULT, H5P_DEFAULT)
                    : -1;
    ok = attr >= 0 && H5Awrite(attr, H5T_NATIVE_INT64, size) >= 0;
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(pair);
    H5Sclose(scalar);
    H5Tclose(str);
    return H5Fclose(f) >= 0 && ok;
}

static void accepted_check(const FluxShards *s) {
    uint64_t latent = (uint64_t)s->C * s->H * s->W, t5 = (uint64_t)s->L * s->D_t5;
    bool ok = s->C >= 1 && s->H >= 1 && s->W >= 1 && s->L >= 1 && s->D_t5 >= 1 &&
              s->D_clip >= 1 && latent <= (1u << 30) && t5 <= (1u << 30) &&
              s->H % 2 == 0 && s->W % 2 == 0 && s->image_size[0] >= 1 && s->image_size[1] >= 1;
    if (ok) return;
    fprintf(stderr, "fuzz: an accepted shard outside the limits: latents %dx%dx%d, T5 %dx%d, "
            "CLIP %d, image_size %dx%d\n", s->C, s->H, s->W, s->L, s->D_t5, s->D_clip,
            s->image_size[0], s->image_size[1]);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);  // HDF5's own refusals of a description are no finding
    char path[128], err[1024] = "";
    snprintf(path, sizeof path, "%s/shard.h5", fuzz_folder_path());
    Reader r = {data, size, 0};
    if (!shard_write(path, &r)) return 0;
    FluxShards s;
    if (flux_shards_try_open(&s, path, 2, err, sizeof err)) {
        accepted_check(&s);
        flux_shards_close(&s);
    } else {
        fuzz_refusal_check(err);
    }
    return 0;
}
