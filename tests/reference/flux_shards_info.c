// What titan's FLUX shard reader (data/flux_shards.h) sees in a dataset, for
// tests/integration/test_flux_data.sh to compare with h5py's view of the same files:
//   flux_shards_info PATH PATCH [I...]
// prints "n=N shards=S C=.. H=.. W=.. L=.. D_t5=.. D_clip=.. image_size=HxW labels=0|1
// captions=0|1", the three encoder attributes as "NAME=VALUE" lines, then for each example I
// "I label caption|latent_sum t5_sum clip_sum" (sums in double, %.9g). Bad input exits 2 with
// the reader's one line.
#include <stdio.h>
#include <stdlib.h>

#include "core/errors.h"
#include "data/flux_shards.h"

static double sum(const float *x, size_t n) {
    double s = 0;
    for (size_t k = 0; k < n; k++) s += x[k];
    return s;
}

static void example_print(FluxShards *s, int64_t i) {
    if (i < 0 || i >= s->n) die_user("flux_shards_info: example %lld is not in [0, %lld)",
                                     (long long)i, (long long)s->n);
    size_t nl = (size_t)s->C * s->H * s->W, nt = (size_t)s->L * s->D_t5;
    float *latent = xmalloc(nl * sizeof(float)), *t5 = xmalloc(nt * sizeof(float));
    float *clip = xmalloc((size_t)s->D_clip * sizeof(float));
    int32_t label = -1;
    flux_shards_read(s, i, latent, t5, clip, s->has_labels ? &label : NULL);
    char *caption = s->has_captions ? flux_shards_caption(s, i) : NULL;
    printf("%lld %d %s|%.9g %.9g %.9g\n", (long long)i, label, caption ? caption : "",
           sum(latent, nl), sum(t5, nt), sum(clip, (size_t)s->D_clip));
    free(caption), free(latent), free(t5), free(clip);
}

int main(int argc, char **argv) {
    if (argc < 3) die_user("usage: flux_shards_info PATH PATCH [I...]");
    FluxShards s;
    flux_shards_open(&s, argv[1], atoi(argv[2]) > 0 ? atoi(argv[2]) : 1);
    printf("n=%lld shards=%d C=%d H=%d W=%d L=%d D_t5=%d D_clip=%d image_size=%dx%d labels=%d "
           "captions=%d\n", (long long)s.n, s.n_shards, s.C, s.H, s.W, s.L, s.D_t5, s.D_clip,
           s.image_size[0], s.image_size[1], s.has_labels, s.has_captions);
    printf("t5_encoder=%s\nclip_encoder=%s\nautoencoder=%s\n", s.t5_encoder, s.clip_encoder,
           s.autoencoder);
    for (int a = 3; a < argc; a++) example_print(&s, atoll(argv[a]));
    flux_shards_close(&s);
    return 0;
}
