#include "parallel/muon_shards.h"

#include <stdio.h>

#include "core/errors.h"

// The placements that cut p over ranks (a group of one rank is none): tensor parallel's Shard
// and FSDP's padded Shard. Replicated and pipeline placements cut nothing, nor does expert
// parallel's Shard(0) of a stack (whole experts).
typedef struct {
    int tp, fsdp;  // their index in p->placements, -1: none
    int nt, nf;    // their group sizes (1: none)
} Cuts;

static bool cuts_of(const Param *p, Cuts *c, char *err, size_t errlen) {
    *c = (Cuts){.tp = -1, .fsdp = -1, .nt = 1, .nf = 1};
    for (int i = 0; i < p->n_placements; i++) {
        const Placement *pl = &p->placements[i];
        if (pl->kind == PLACE_REPLICATE || pl->kind == PLACE_OWNED) continue;
        if (pl->kind == PLACE_SHARD && pl->group == MESH_GROUP_EP && p->ndim == 3 && pl->dim == 0)
            continue;
        if (pl->kind == PLACE_SHARD && pl->group == MESH_TP && pl->n_blocks == 0) {
            c->tp = i, c->nt = pl->size;
        } else if (pl->kind == PLACE_SHARD_PADDED && pl->group == MESH_GROUP_FSDP) {
            c->fsdp = i, c->nf = pl->size;
        } else {
            snprintf(err, errlen, "optimizer.name Muon cannot gather %s whole: it is %s", p->name,
                     pl->group == MESH_GROUP_EFSDP ? "an expert weight FSDP shards over efsdp "
                                                     "(expert_parallel_degree below dp_shard x "
                                                     "cp x tp)"
                                                   : "cut in blocks (a fused weight)");
            return false;
        }
    }
    return true;
}

bool muon_dist_plan(const Param *p, size_t *floats, char *err, size_t errlen) {
    Cuts c;
    if (!cuts_of(p, &c, err, errlen)) return false;
    size_t S = p->shard_numel, members = (size_t)c.nt * c.nf;
    *floats = members == 1 ? 0 : (c.tp >= 0 && c.fsdp >= 0 ? (size_t)c.nf * S : 0) + members * S;
    return true;
}

typedef struct {
    const KernelOps *k;
    float *to;
    const float *from;
    bool gathering;  // from a member's shard into the whole tensor; else the reverse
} RunCopy;

static void run_copy(size_t global_first, size_t local_first, size_t count, void *arg) {
    const RunCopy *r = arg;
    if (r->gathering)
        r->k->copy(r->to + global_first, r->from + local_first, count * sizeof(float));
    else
        r->k->copy(r->to + local_first, r->from + global_first, count * sizeof(float));
}

// The rank (t, f) of the cut's groups that orthogonalizes the ordinal-th matrix.
static int owner_of(const Cuts *c, int ordinal) { return ordinal % (c->nt * c->nf); }

static float *gather(MuonShards *h, const Param *p, int ordinal, const float *shard,
                     float *whole) {
    MuonDist *d = (MuonDist *)h;
    Cuts c;
    char err[256];
    CHECK(cuts_of(p, &c, err, sizeof err));
    if (c.nt * c.nf == 1) return (float *)shard;
    size_t S = p->shard_numel;
    const float *all = shard;
    float *next = h->buffer;
    if (c.fsdp >= 0) {  // every FSDP rank's shard of this rank's tp slice, in fsdp order
        comm_all_gather(d->mesh->fsdp, all, next, S);
        all = next, next += (size_t)c.nf * S;
    }
    if (c.tp >= 0)  // then every tp rank's: member (t, f) at (t nf + f) S
        comm_all_gather(d->mesh->group[MESH_TP], all, next, (size_t)c.nf * S);
    all = c.tp >= 0 ? next : all;
    for (int t = 0; t < c.nt; t++)
        for (int f = 0; f < c.nf; f++) {
            Param member = *p;
            if (c.tp >= 0) member.placements[c.tp].rank = t;
            if (c.fsdp >= 0) member.placements[c.fsdp].rank = f;
            ParamBox box = param_box(&member, true);
            RunCopy r = {d->k, whole, all + ((size_t)t * c.nf + f) * S, true};
            param_box_runs(p, &box, run_copy, &r);
        }
    int t = c.tp >= 0 ? p->placements[c.tp].rank : 0;
    int f = c.fsdp >= 0 ? p->placements[c.fsdp].rank : 0;
    return t * c.nf + f == owner_of(&c, ordinal) ? whole : NULL;
}

// The owner's result over tp (every tp group from its member at the owner's tp rank: the one
// at the owner's fsdp rank holds it), then over FSDP from the owner's fsdp rank.
static void scatter(MuonShards *h, const Param *p, int ordinal, float *whole, float *shard) {
    MuonDist *d = (MuonDist *)h;
    Cuts c;
    char err[256];
    CHECK(cuts_of(p, &c, err, sizeof err));
    if (c.nt * c.nf == 1) return;
    int owner = owner_of(&c, ordinal);
    size_t bytes = param_global_numel(p) * sizeof(float);
    if (c.tp >= 0) comm_broadcast(d->mesh->group[MESH_TP], whole, bytes, owner / c.nf);
    if (c.fsdp >= 0) comm_broadcast(d->mesh->fsdp, whole, bytes, owner % c.nf);
    ParamBox box = param_box(p, true);
    RunCopy r = {d->k, shard, whole, false};
    param_box_runs(p, &box, run_copy, &r);
}

void muon_dist_init(MuonDist *d, const Mesh *mesh, const KernelOps *k, size_t floats) {
    *d = (MuonDist){.hooks = {.gather = gather, .scatter = scatter, .floats = floats},
                    .mesh = mesh, .k = k};
}

int muon_dist_members(const Param *p) {
    Cuts c;
    char err[256];
    return cuts_of(p, &c, err, sizeof err) ? c.nt * c.nf : 1;
}

uint64_t muon_dist_bytes(const Param *p, int group) {
    Cuts c;
    char err[256];
    if (!cuts_of(p, &c, err, sizeof err) || !p->shard_numel) return 0;
    uint64_t S = p->shard_numel, whole = param_global_numel(p);
    if (group == MESH_GROUP_FSDP && c.fsdp >= 0) return 4 * (S + whole);
    if (group == MESH_TP && c.tp >= 0) return 4 * ((uint64_t)c.nf * S + whole);
    return 0;
}
