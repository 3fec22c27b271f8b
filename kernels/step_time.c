// predict_step_time: kernels/step_time.h's model, term by term.
#include "kernels/step_time.h"

#include "core/errors.h"

// The rate of a GEMM precision: float8 runs at bf16's where the device has no float8 rate.
static double gemm_rate(const DeviceTable *d, GemmPrecision p) {
    if (p == GEMM_FLOAT8 && d->gemm[p] <= 0) p = GEMM_BF16;
    if (p == GEMM_BF16 && d->gemm[p] <= 0) p = GEMM_FP32;
    return d->gemm[p];
}

// Bytes/s of the link a group of `span` consecutive ranks crosses: the network once it spans
// more devices than a node holds (devices_per_node 0: every rank on one node).
static double link_rate(const DeviceTable *d, int span) {
    bool network = d->devices_per_node > 0 && span > d->devices_per_node;
    return network ? d->link_network : d->link_node;
}

StepTime predict_step_time(const StepWork *w, const DeviceTable *d) {
    StepTime s = {0};
    for (int p = 0; p < GEMM_PRECISIONS; p++)
        if (w->gemm_flops[p] > 0) {
            double rate = gemm_rate(d, (GemmPrecision)p);
            CHECK(rate > 0);
            s.gemm += w->gemm_flops[p] / rate;
        }
    if (w->attention_flops > 0) s.attention = w->attention_flops / d->attention;
    s.elementwise = w->elementwise_bytes / d->memory;
    if (w->cast_bytes > 0) s.casts = w->cast_bytes / d->cast;
    s.optimizer = w->optimizer_bytes / d->optimizer;
    s.ops = w->ops * d->op;
    s.compute = (s.gemm + s.attention + s.elementwise + s.casts + s.optimizer + s.ops) * w->sharing;
    for (int g = 0; g < w->n_groups; g++) {
        const GroupWork *gw = &w->groups[g];
        if (gw->bytes <= 0) continue;
        double rate = link_rate(d, gw->span);
        CHECK(rate > 0);
        *(gw->blocking ? &s.blocking : &s.overlapped) += gw->bytes / rate;
    }
    s.exposed = s.overlapped > s.compute ? s.overlapped - s.compute : 0;
    CHECK(w->bubble >= 0 && w->bubble < 1);
    s.step = (s.compute + s.blocking + s.exposed) / (1 - w->bubble);
    return s;
}
