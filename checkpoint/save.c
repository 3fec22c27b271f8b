// ckpt_try_save: a checkpoint written by every rank of a job at the disk's rate, as one plain
// HDF5 file.
//
// Parallel HDF5 writes a filtered (checksummed) dataset only in a collective call, one per
// dataset, plus collective creates and closes: hundreds of collectives per save, each waiting
// for the slowest rank, which made 4 ranks save 3-12x slower than one (issue 32). Here HDF5
// does no collective and no rank waits for another while writing:
// 1. Every rank sends rank 0 the blocks it writes (its box of each tensor, a replica's none).
// 2. Rank 0 lays the file out alone, with serial HDF5 through a driver that can drop raw data
//    (checkpoint/metadata_driver.h): every dataset, chunked on a grid whose lines include
//    every block's boundaries (checkpoint/chunk_grid.h), so that each chunk is one rank's;
//    each chunk's place allocated by a direct chunk write of its filtered size (the bytes
//    dropped, their address kept: 1.3 us a chunk, where HDF5 1.10's chunk lookup takes time
//    linear in the chunks); the attributes. Each rank's chunks are allocated one after
//    another, so each rank writes one run of the file.
// 3. Rank 0 reserves the file's whole size on disk and sends every rank its chunks' places.
// 4. Every rank copies each of its chunks out of its box, appends HDF5's Fletcher32 checksum
//    (checkpoint/fletcher32.h) and pwrites it there, then fsyncs.
// 5. Rank 0 publishes the file. The file is the one a collective write made: h5py reads it,
//    HDF5 verifies every chunk's checksum on read, any layout loads it.
//
// A failure anywhere (a full disk, a dying one) is agreed by every rank at the next of the
// save's three agreements, none of which can be stuck behind another rank's failed call.
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/chunk_grid.h"
#include "checkpoint/fletcher32.h"
#include "checkpoint/internal.h"
#include "checkpoint/metadata_driver.h"
#include "core/errors.h"
#include "core/files.h"

// A save on one rank: the communicator its ranks agree over (MPI_COMM_NULL: a process of one)
// and its failure, 0 while none: the errno of a disk error (ENOSPC, EDQUOT, EIO...) when known,
// else 1.
typedef struct {
    MPI_Comm comm;
    int rank, ranks;
    int failure;
    off_t bound;      // the file's size: estimated, then exact once rank 0 has laid it out
    const char *tmp;  // the file being written
} Save;

// A growable array of int64: the messages between the ranks.
typedef struct {
    int64_t *v;
    size_t n, cap;
} Ints;

static void ints_push(Ints *a, int64_t x) {
    a->v = xgrow(a->v, &a->cap, a->n + 1, sizeof *a->v);
    a->v[a->n++] = x;
}

// An MPI count: a message of a save holds a few int64 per block or chunk, far below INT_MAX
// even for a 405B state on 2048 ranks (35M at most).
static int mpi_count(size_t n) {
    CHECK(n <= INT_MAX);
    return (int)n;
}

// The errno of a failed write in HDF5's error stack, where a driver said "errno = N".
static herr_t find_disk_error(unsigned n, const H5E_error2_t *e, void *found) {
    (void)n;
    const char *at = e->desc ? strstr(e->desc, "errno = ") : NULL;
    if (at && !*(int *)found) *(int *)found = atoi(at + 8);
    return 0;
}

// Records a failed HDF5 call (ok false) with the disk's reason when known: the metadata
// driver's errno, else the one in HDF5's error stack.
static void save_note(Save *s, bool ok) {
    if (ok || s->failure) return;
    int code = metadata_driver_take_errno();
    if (!code) H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, find_disk_error, &code);
    s->failure = code > 0 ? code : 1;
}

// Records a failed system call (ok false) with its errno.
static void save_note_errno(Save *s, bool ok) {
    if (!ok && !s->failure) s->failure = errno > 0 ? errno : 1;
}

// Every rank goes on, or all stop together, whichever rank failed (its failure noted).
static bool save_agree(Save *s, bool ok) {
    if (!ok && !s->failure) s->failure = 1;
    if (s->comm != MPI_COMM_NULL)
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &s->failure, 1, MPI_INT, MPI_MAX, s->comm));
    return s->failure == 0;
}

// One block of this rank's box of a tensor, and where its first element sits in the box's
// local (row-major) data.
typedef struct {
    CkptBlock at;
    int64_t local[CKPT_MAX_DIMS];
} OwnBlock;

// The blocks of t this rank writes (a box of several ranges along a dim is one block per
// combination), into out (NULL: only counted): none for a replica or an empty box.
static int own_blocks(const CkptTensor *t, OwnBlock *out) {
    CHECK(t->ndim >= 1 && t->ndim <= CKPT_MAX_DIMS);  // a scalar is an attribute
    if (t->replica) return 0;
    if (!t->box) {
        if (out) {
            *out = (OwnBlock){0};
            for (int d = 0; d < t->ndim; d++) out->at.count[d] = t->shape[d];
        }
        return 1;
    }
    const ParamBox *b = t->box;
    CHECK(b->ndim == t->ndim);
    for (int d = 0; d < t->ndim; d++)
        if (b->count[d] == 0) return 0;
    int n = 0, at[PARAM_MAX_DIMS] = {0};
    for (bool more = true; more; n++) {
        if (out) {
            OwnBlock *o = &out[n];
            for (int d = 0; d < t->ndim; d++) {
                o->at.start[d] = b->ranges[d].start[at[d]];
                o->at.count[d] = b->ranges[d].count[at[d]];
                o->local[d] = 0;
                for (int r = 0; r < at[d]; r++) o->local[d] += b->ranges[d].count[r];
            }
        }
        more = false;  // the next combination, the last dim's range fastest
        for (int d = t->ndim - 1; d >= 0 && !more; d--) {
            more = ++at[d] < b->ranges[d].n;
            if (!more) at[d] = 0;
        }
    }
    return n;
}

// The message to rank 0: per tensor, the number of blocks, then each one's start and count.
static Ints blocks_message(const CkptTensor *tensors, int n_tensors) {
    Ints m = {0};
    for (int i = 0; i < n_tensors; i++) {
        int n = own_blocks(&tensors[i], NULL);
        OwnBlock *blocks = xmalloc(((size_t)n + 1) * sizeof *blocks);
        own_blocks(&tensors[i], blocks);
        ints_push(&m, n);
        for (int k = 0; k < n; k++)
            for (int d = 0; d < tensors[i].ndim; d++) {
                ints_push(&m, blocks[k].at.start[d]);
                ints_push(&m, blocks[k].at.count[d]);
            }
        free(blocks);
    }
    return m;
}

// Every rank's message on rank 0: all[offsets[r] ..] is rank r's (elsewhere all is NULL).
static int64_t *blocks_gather(Save *s, const Ints *mine, int **offsets) {
    *offsets = xcalloc((size_t)s->ranks + 1, sizeof **offsets);
    int n = mpi_count(mine->n);
    if (s->comm == MPI_COMM_NULL) {
        (*offsets)[1] = n;
        int64_t *all = xmalloc(((size_t)n + 1) * sizeof *all);
        if (n) memcpy(all, mine->v, (size_t)n * sizeof *all);
        return all;
    }
    int *counts = xcalloc((size_t)s->ranks, sizeof *counts);
    MPI_CHECK(MPI_Gather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, s->comm));
    for (int r = 0; r < s->ranks; r++)
        (*offsets)[r + 1] = mpi_count((size_t)(*offsets)[r] + (size_t)counts[r]);
    int64_t *all = s->rank == 0 ? xmalloc(((size_t)(*offsets)[s->ranks] + 1) * sizeof *all) : NULL;
    MPI_CHECK(MPI_Gatherv(mine->v, n, MPI_INT64_T, all, counts, *offsets, MPI_INT64_T, 0,
                          s->comm));
    free(counts);
    return all;
}

// Rank 0's view of one tensor: every rank's blocks (owner[k] writes blocks[k]), by rank.
typedef struct {
    CkptBlock *blocks;
    int *owner;
    int n;
} Writers;

// Counted first, then filled: every tensor's blocks allocated once.
static Writers *writers_parse(const Save *s, const int64_t *all, const int *offsets,
                              const CkptTensor *tensors, int n_tensors) {
    Writers *w = xcalloc((size_t)n_tensors + 1, sizeof *w);
    for (int r = 0; r < s->ranks; r++) {
        const int64_t *p = all + offsets[r];
        for (int i = 0; i < n_tensors; i++) {
            w[i].n += (int)*p;
            p += 1 + *p * 2 * tensors[i].ndim;
        }
    }
    for (int i = 0; i < n_tensors; i++) {
        w[i].blocks = xcalloc((size_t)w[i].n + 1, sizeof *w[i].blocks);
        w[i].owner = xcalloc((size_t)w[i].n + 1, sizeof *w[i].owner);
        w[i].n = 0;
    }
    for (int r = 0; r < s->ranks; r++) {
        const int64_t *p = all + offsets[r];
        for (int i = 0; i < n_tensors; i++) {
            int n = (int)*p++;
            for (int k = 0; k < n; k++, w[i].n++) {
                CkptBlock *b = &w[i].blocks[w[i].n];
                for (int d = 0; d < tensors[i].ndim; d++) b->start[d] = *p++, b->count[d] = *p++;
                w[i].owner[w[i].n] = r;
            }
        }
        CHECK(p == all + offsets[r + 1]);
    }
    return w;
}

static void writers_free(Writers *w, int n_tensors) {
    for (int i = 0; i < n_tensors; i++) free(w[i].blocks), free(w[i].owner);
    free(w);
}

static int64_t chunk_floats(int ndim, const int64_t *chunk) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= chunk[d];
    return n;
}

// Chunked on its grid, each chunk checksummed; no fill: every chunk is written.
static hid_t dataset_create_plist(int ndim, const int64_t *chunk) {
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5_CHECK(dcpl);
    H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
    hsize_t dims[CKPT_MAX_DIMS];
    for (int d = 0; d < ndim; d++) dims[d] = (hsize_t)chunk[d];
    H5_CHECK(H5Pset_chunk(dcpl, ndim, dims));
    H5_CHECK(H5Pset_fletcher32(dcpl));
    return dcpl;
}

static hid_t dataset_create(hid_t file, hid_t lcpl, const CkptTensor *t, const int64_t *chunk) {
    hsize_t dims[CKPT_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) {
        CHECK(t->shape[d] >= 1);
        dims[d] = (hsize_t)t->shape[d];
    }
    hid_t space = H5Screate_simple(t->ndim, dims, NULL);
    hid_t dcpl = dataset_create_plist(t->ndim, chunk);
    H5_CHECK(space);
    hid_t dset = H5Dcreate2(file, t->path, H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT);
    H5_CHECK(H5Pclose(dcpl));
    H5_CHECK(H5Sclose(space));
    return dset;
}

// Allocates the chunk at origin in the file: a direct write of its filtered size, whose bytes
// the metadata driver drops, telling where HDF5 placed it. HADDR_UNDEF on a failure.
static haddr_t chunk_place(hid_t dset, int ndim, const int64_t *origin, size_t bytes,
                           const void *placeholder) {
    hsize_t at[CKPT_MAX_DIMS];
    for (int d = 0; d < ndim; d++) at[d] = (hsize_t)origin[d];
    metadata_driver_take_dropped(&(haddr_t){0}, &(size_t){0});
    if (H5Dwrite_chunk(dset, H5P_DEFAULT, 0, at, bytes, placeholder) < 0) return HADDR_UNDEF;
    haddr_t addr;
    size_t size;
    CHECK(metadata_driver_take_dropped(&addr, &size) && size == bytes);
    return addr;
}

// Variable-length so that a config of any size fits (fixed-size attributes are capped at
// 64 KiB in compact storage); h5py reads it as a str.
static hid_t string_type_create(void) {
    hid_t type = H5Tcopy(H5T_C_S1);
    H5_CHECK(type);
    H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
    H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
    return type;
}

static bool attr_write(hid_t file, const CkptAttr *a) {
    hid_t space = H5Screate(H5S_SCALAR);
    H5_CHECK(space);
    hid_t file_type = a->type == CKPT_INT      ? H5Tcopy(H5T_STD_I64LE)
                      : a->type == CKPT_DOUBLE ? H5Tcopy(H5T_IEEE_F64LE)
                                               : string_type_create();
    H5_CHECK(file_type);
    hid_t attr = H5Acreate2(file, a->name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
    bool ok = attr >= 0;
    if (ok && a->type == CKPT_INT) ok = H5Awrite(attr, H5T_NATIVE_INT64, &a->i) >= 0;
    if (ok && a->type == CKPT_DOUBLE) ok = H5Awrite(attr, H5T_NATIVE_DOUBLE, &a->d) >= 0;
    if (ok && a->type == CKPT_STRING) ok = H5Awrite(attr, file_type, &a->s) >= 0;
    if (attr >= 0) ok = H5Aclose(attr) >= 0 && ok;
    H5_CHECK(H5Tclose(file_type));
    H5_CHECK(H5Sclose(space));
    return ok;
}

// What rank 0 lays out: each tensor's chunk dims, and every rank's chunks (per chunk: the
// tensor, its origin, its address), rank by rank: rank r's from places.v[starts[r]].
typedef struct {
    int64_t (*chunk)[CKPT_MAX_DIMS];
    Ints places;
    size_t *starts;  // [ranks + 1]
} Layout;

// The tensors' datasets and their chunks' places, rank by rank, then the attributes; false
// (the failure noted) if the file could not take them.
static bool layout_write(Save *s, hid_t file, const CkptTensor *tensors, int n_tensors,
                         const Writers *w, const CkptAttr *attrs, int n_attrs, Layout *l) {
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5_CHECK(lcpl);
    H5_CHECK(H5Pset_create_intermediate_group(lcpl, 1));
    hid_t *dsets = xmalloc(((size_t)n_tensors + 1) * sizeof *dsets);
    int opened = 0;
    bool ok = true;
    for (; opened < n_tensors && ok; opened++) {
        dsets[opened] = dataset_create(file, lcpl, &tensors[opened], l->chunk[opened]);
        ok = dsets[opened] >= 0;
    }
    if (!ok) opened--;
    void *placeholder = xcalloc(1, CHUNK_GRID_MAX_FLOATS * sizeof(float) + 4);
    int *next = xcalloc((size_t)n_tensors + 1, sizeof *next);  // each tensor's blocks, by owner
    metadata_driver_drop_raw(true);  // the placeholders' bytes; nothing else writes raw data
    for (int r = 0; r < s->ranks && ok; r++, l->starts[r] = l->places.n)
        for (int i = 0; i < n_tensors && ok; i++) {
            const CkptTensor *t = &tensors[i];
            size_t bytes = (size_t)chunk_floats(t->ndim, l->chunk[i]) * sizeof(float) + 4;
            for (; next[i] < w[i].n && w[i].owner[next[i]] == r && ok; next[i]++) {
                int k = next[i];
                int64_t n = chunk_grid_block_count(t->ndim, t->shape, l->chunk[i], &w[i].blocks[k]);
                for (int64_t c = 0; c < n && ok; c++) {
                    int64_t origin[CKPT_MAX_DIMS];
                    chunk_grid_origin(t->ndim, l->chunk[i], &w[i].blocks[k], c, origin);
                    haddr_t addr = chunk_place(dsets[i], t->ndim, origin, bytes, placeholder);
                    ok = addr != HADDR_UNDEF;
                    ints_push(&l->places, i);
                    for (int d = 0; d < t->ndim; d++) ints_push(&l->places, origin[d]);
                    ints_push(&l->places, (int64_t)addr);
                }
            }
        }
    metadata_driver_drop_raw(false);  // before the attributes: strings live in the global heap
    free(placeholder), free(next);
    for (int i = 0; i < n_tensors && ok; i++) {  // no chunk placed twice (two ranks' boxes
        hsize_t placed;                          // overlapping) and none left out
        hid_t space = H5Dget_space(dsets[i]);
        H5_CHECK(space);
        ok = H5Dget_num_chunks(dsets[i], space, &placed) >= 0;
        H5_CHECK(H5Sclose(space));
        if (ok && (int64_t)placed != chunk_grid_count(tensors[i].ndim, tensors[i].shape,
                                                      l->chunk[i]))
            die_internal(__FILE__, __LINE__, "checkpoint: the ranks' boxes of %s overlap",
                         tensors[i].path);
    }
    for (int i = 0; i < opened; i++) ok = H5Dclose(dsets[i]) >= 0 && ok;
    free(dsets);
    H5_CHECK(H5Pclose(lcpl));
    for (int i = 0; i < n_attrs && ok; i++) ok = attr_write(file, &attrs[i]);
    save_note(s, ok);
    return ok;
}

// Every tensor's chunk dims from its writers' blocks, which must tile it: each chunk of the
// grid one rank's.
static void layout_plan(const CkptTensor *tensors, int n_tensors, const Writers *w, Layout *l) {
    for (int i = 0; i < n_tensors; i++) {
        const CkptTensor *t = &tensors[i];
        chunk_grid_dims(t->ndim, t->shape, w[i].blocks, w[i].n, l->chunk[i]);
        int64_t covered = 0;
        for (int k = 0; k < w[i].n; k++)
            covered += chunk_grid_block_count(t->ndim, t->shape, l->chunk[i], &w[i].blocks[k]);
        if (covered != chunk_grid_count(t->ndim, t->shape, l->chunk[i]))
            die_internal(__FILE__, __LINE__, "checkpoint: the ranks' boxes of %s do not tile it "
                         "(%lld of %lld chunks)", t->path, (long long)covered,
                         (long long)chunk_grid_count(t->ndim, t->shape, l->chunk[i]));
    }
}

// A bound on the file's size, for the failure line of a save that fails before rank 0 has
// laid it out: the data, a checksum and index entry per chunk, an object header per dataset
// and the attributes (the config), with room to spare.
static off_t save_file_bound(const CkptTensor *tensors, int n_tensors, const CkptAttr *attrs,
                             int n_attrs) {
    double data = 0;
    for (int i = 0; i < n_tensors; i++) {
        double n = 4;
        for (int d = 0; d < tensors[i].ndim; d++) n *= (double)tensors[i].shape[d];
        data += n;
    }
    double chunks = data / (4.0 * CKPT_CHUNK_FLOATS);
    double bound = data + (chunks + n_tensors) * 64.0 + n_tensors * 16384.0 + (1 << 20);
    for (int i = 0; i < n_attrs; i++)
        bound += 1024.0 + (attrs[i].type == CKPT_STRING ? (double)strlen(attrs[i].s) : 8);
    return (off_t)(bound * 1.01);
}

// Reserves the laid-out file's whole size on disk (the chunks' places are holes until the
// ranks write them), so that a disk too full for the checkpoint fails here, on rank 0, before
// any rank writes. 0, or the errno. A file system that cannot reserve is asked for its free
// space instead.
static int space_reserve(const char *tmp, off_t bytes) {
    int fd = open(tmp, O_WRONLY);
    if (fd < 0) return errno;
    int rc = fallocate(fd, 0, 0, bytes) == 0 ? 0 : errno;
    close(fd);
    struct statvfs fs;
    if ((rc == EOPNOTSUPP || rc == ENOSYS) && statvfs(tmp, &fs) == 0)
        rc = (double)fs.f_bavail * fs.f_frsize < (double)bytes ? ENOSPC : 0;
    return rc;
}

// Rank 0: the file laid out (datasets, chunk places, attributes), closed and its space
// reserved; false with the failure noted.
static bool layout_file(Save *s, const CkptTensor *tensors, int n_tensors, const Writers *w,
                        const CkptAttr *attrs, int n_attrs, Layout *l) {
    layout_plan(tensors, n_tensors, w, l);
    hid_t fapl = metadata_driver_fapl();
    hid_t file = H5Fcreate(s->tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5_CHECK(H5Pclose(fapl));
    if (file < 0) {
        save_note(s, false);
        return false;
    }
    bool ok = layout_write(s, file, tensors, n_tensors, w, attrs, n_attrs, l);
    ok = H5Fclose(file) >= 0 && ok;  // closing writes the metadata out
    save_note(s, ok);
    struct stat st;
    if (ok && stat(s->tmp, &st) == 0) s->bound = st.st_size;
    int reserved = ok ? space_reserve(s->tmp, s->bound) : 0;
    if (reserved && !s->failure) s->failure = reserved;
    return ok && !reserved;
}

// This rank's chunks (tensor, origin, address), sent by rank 0, and every tensor's chunk dims.
static Ints places_scatter(Save *s, Layout *l, int n_tensors) {
    Ints mine = {0};
    if (s->comm == MPI_COMM_NULL) {  // a process of one: its own, handed over
        mine = l->places;
        l->places = (Ints){0};
        return mine;
    }
    MPI_CHECK(MPI_Bcast(l->chunk, n_tensors * CKPT_MAX_DIMS, MPI_INT64_T, 0, s->comm));
    int *counts = xcalloc((size_t)s->ranks, sizeof *counts);
    int *offsets = xcalloc((size_t)s->ranks, sizeof *offsets);
    if (s->rank == 0)
        for (int r = 0; r < s->ranks; r++) {
            counts[r] = mpi_count(l->starts[r + 1] - l->starts[r]);
            offsets[r] = mpi_count(l->starts[r]);
        }
    int n;
    MPI_CHECK(MPI_Scatter(counts, 1, MPI_INT, &n, 1, MPI_INT, 0, s->comm));
    mine.n = mine.cap = (size_t)n;
    mine.v = xmalloc(((size_t)n + 1) * sizeof *mine.v);
    MPI_CHECK(MPI_Scatterv(l->places.v, counts, offsets, MPI_INT64_T, mine.v, n, MPI_INT64_T, 0,
                           s->comm));
    free(counts), free(offsets);
    return mine;
}

// Copies the chunk at origin out of block b of t's box into buf (the whole chunk, row-major;
// zeros past the tensor's end, as HDF5 stores an edge chunk).
static void chunk_assemble(const CkptTensor *t, const OwnBlock *b, const int64_t *chunk,
                           const int64_t *origin, float *buf) {
    int nd = t->ndim;
    const int64_t *box = t->box ? t->box->count : t->shape;
    int64_t extent[CKPT_MAX_DIMS], box_stride[CKPT_MAX_DIMS], chunk_stride[CKPT_MAX_DIMS];
    bool edge = false;
    for (int d = nd - 1; d >= 0; d--) {
        int64_t left = t->shape[d] - origin[d];
        extent[d] = chunk[d] < left ? chunk[d] : left;
        edge = edge || extent[d] < chunk[d];
        box_stride[d] = d == nd - 1 ? 1 : box_stride[d + 1] * box[d + 1];
        chunk_stride[d] = d == nd - 1 ? 1 : chunk_stride[d + 1] * chunk[d + 1];
    }
    if (edge) memset(buf, 0, (size_t)chunk_floats(nd, chunk) * sizeof(float));
    int64_t rows = 1, idx[CKPT_MAX_DIMS] = {0};
    for (int d = 0; d < nd - 1; d++) rows *= extent[d];
    for (int64_t row = 0; row < rows; row++) {
        int64_t src = 0, dst = 0;
        for (int d = 0; d < nd; d++) {
            src += (b->local[d] + origin[d] - b->at.start[d] + idx[d]) * box_stride[d];
            dst += idx[d] * chunk_stride[d];
        }
        memcpy(buf + dst, t->data + src, (size_t)extent[nd - 1] * sizeof(float));
        for (int d = nd - 2; d >= 0 && ++idx[d] == extent[d]; d--) idx[d] = 0;
    }
}

// The own block of t that holds the chunk at origin.
static const OwnBlock *block_holding(const OwnBlock *blocks, int n, int ndim,
                                     const int64_t *origin) {
    for (int k = 0; k < n; k++) {
        bool in = true;
        for (int d = 0; d < ndim && in; d++)
            in = origin[d] >= blocks[k].at.start[d] &&
                 origin[d] < blocks[k].at.start[d] + blocks[k].at.count[d];
        if (in) return &blocks[k];
    }
    die_internal(__FILE__, __LINE__, "checkpoint: rank 0 sent a chunk this rank does not hold");
}

static bool write_all(int fd, const void *buf, size_t size, off_t at) {
    for (const char *p = buf; size > 0;) {
        ssize_t n = pwrite(fd, p, size, at);
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) errno = EIO;  // nothing written and no reason given
        if (n <= 0) return false;
        p += n, at += n, size -= (size_t)n;
    }
    return true;
}

// Every chunk rank 0 placed for this rank, checksummed and written, then fsynced.
static bool chunks_write(Save *s, const CkptTensor *tensors, const Layout *l, const Ints *mine) {
    if (mine->n == 0) return save_agree(s, true);  // all replicas: no file to touch
    int fd = open(s->tmp, O_WRONLY);
    save_note_errno(s, fd >= 0);
    if (fd < 0) return save_agree(s, false);
    float *buf = xmalloc(CHUNK_GRID_MAX_FLOATS * sizeof(float) + 4);
    OwnBlock *blocks = NULL;
    int current = -1, n_blocks = 0;
    bool ok = true;
    for (size_t k = 0; k < mine->n && ok;) {
        int i = (int)mine->v[k++];
        const CkptTensor *t = &tensors[i];
        if (i != current) {  // rank 0 sends a tensor's chunks together
            current = i, n_blocks = own_blocks(t, NULL);
            free(blocks);
            blocks = xmalloc(((size_t)n_blocks + 1) * sizeof *blocks);
            own_blocks(t, blocks);
        }
        const int64_t *origin = &mine->v[k];
        k += t->ndim;
        off_t addr = (off_t)mine->v[k++];
        chunk_assemble(t, block_holding(blocks, n_blocks, t->ndim, origin), l->chunk[i], origin,
                       buf);
        size_t bytes = (size_t)chunk_floats(t->ndim, l->chunk[i]) * sizeof(float);
        h5_fletcher32_append((uint8_t *)buf, bytes);
        ok = write_all(fd, buf, bytes + 4, addr);
        save_note_errno(s, ok);
        // The chunk's writeback starts now, under the next chunk's copy and checksum, rather
        // than all at the fsync (the page cache would otherwise hold the whole file first).
        // Its errors are the fsync's to report.
        if (ok) sync_file_range(fd, addr, (off_t)bytes + 4, SYNC_FILE_RANGE_WRITE);
    }
    free(buf), free(blocks);
    ok = ok && fsync(fd) == 0;
    save_note_errno(s, ok);
    ok = close(fd) == 0 && ok;
    save_note_errno(s, ok);
    return save_agree(s, ok);
}

static void fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    SYS_CHECK(fd);
    SYS_CHECK(fsync(fd));
    SYS_CHECK(close(fd));
}

void ckpt_tmp_prepare(const char *path, char *tmp, size_t tmplen) {
    char dir[1024];
    ckpt_dir_of(path, dir, sizeof(dir));
    CHECK(snprintf(tmp, tmplen, "%s.tmp", path) < (int)tmplen);
    // mkdir -p: the checkpoint folder (e.g. outputs/checkpoint) need not exist before the
    // first save.
    char err[4096 + 256];
    if (!try_make_dirs(dir, err, sizeof err)) die_user("checkpoint: %s", err);
    // A stale .tmp is a save that crashed; it is garbage, never a checkpoint.
    if (unlink(tmp) != 0 && errno != ENOENT)
        die_user("cannot remove stale %s: %s", tmp, strerror(errno));
}

void ckpt_publish(const char *tmp, const char *path) {
    char dir[1024];
    ckpt_dir_of(path, dir, sizeof(dir));
    // Data on disk before the name points at it, and the rename itself made durable.
    fsync_path(tmp);
    SYS_CHECK(rename(tmp, path));
    fsync_path(dir);
}

// ckpt_publish, reporting a failure (its errno kept) instead of dying. Every rank fsynced its
// own chunks; this makes rank 0's view durable and the name point at it.
static bool publish_try(const char *tmp, const char *path) {
    char dir[1024];
    ckpt_dir_of(path, dir, sizeof(dir));
    int fd = open(tmp, O_WRONLY);
    if (fd < 0) return false;
    bool ok = fsync(fd) == 0;
    ok = close(fd) == 0 && ok && rename(tmp, path) == 0;
    int dir_fd = ok ? open(dir, O_RDONLY) : -1;
    if (dir_fd < 0) return false;
    ok = fsync(dir_fd) == 0;
    return close(dir_fd) == 0 && ok;
}

// The errno the line names: the disk's when known, else ENOSPC when the folder is short of
// the save's space; 1 when neither is known.
static int failure_errno(int failure, bool short_of_space) {
    return failure == ENOSPC || (failure != EDQUOT && short_of_space) ? ENOSPC : failure;
}

// The line of a failed save: the reason, the file, what the save needs and what its folder
// has (once the partial file is gone).
static void save_failure_line(const Save *s, char *err, size_t errlen) {
    char dir[1024];
    ckpt_dir_of(s->tmp, dir, sizeof dir);
    struct statvfs fs;
    double need = (double)s->bound, mb = 1024.0 * 1024.0;
    double free_bytes = statvfs(dir, &fs) == 0 ? (double)fs.f_bavail * fs.f_frsize : -1;
    bool short_of_space = free_bytes >= 0 && free_bytes < need;
    char have[64] = "";
    if (free_bytes >= 0) snprintf(have, sizeof have, ", %.1f MB free", free_bytes / mb);
    int code = failure_errno(s->failure, short_of_space);
    char why[128] = "write failed";
    if (code > 1) write_error_why(code, why, sizeof why);
    snprintf(err, errlen, "checkpoint: %s writing %s (about %.1f MB needed%s): %s or set "
             "job.dump_folder elsewhere", why, s->tmp, need / mb, have, write_error_remedy(code));
}

// After an agreed failure: rank 0 removes the partial file and words the one line every rank
// gets.
static void save_abandon(const Save *s, char *err, size_t errlen) {
    if (s->rank == 0) {
        unlink(s->tmp);
        save_failure_line(s, err, errlen);
    }
    if (s->comm != MPI_COMM_NULL)  // after the unlink: no rank goes on (or exits) before it
        MPI_CHECK(MPI_Bcast(err, (int)errlen, MPI_CHAR, 0, s->comm));
}

// The steps of the file comment above. The agreements order them: no rank writes before the
// file is laid out, and no rank goes on (nor a later save or deletion starts) before the
// checkpoint is complete under its name.
bool ckpt_try_save(const char *path, const CkptTensor *tensors, int n_tensors,
                   const CkptAttr *attrs, int n_attrs, MPI_Comm comm, char *err, size_t errlen) {
    ckpt_hdf5_silence();
    H5Eclear2(H5E_DEFAULT);  // an earlier failure's errno is not this save's
    metadata_driver_take_errno();
    int rank, ranks = ckpt_comm_ranks(comm, &rank);
    char tmp[1024];
    if (rank == 0) ckpt_tmp_prepare(path, tmp, sizeof(tmp));
    else CHECK(snprintf(tmp, sizeof tmp, "%s.tmp", path) < (int)sizeof tmp);
    Save s = {.comm = ranks > 1 ? comm : MPI_COMM_NULL, .rank = rank, .ranks = ranks, .tmp = tmp,
              .bound = save_file_bound(tensors, n_tensors, attrs, n_attrs)};
    Ints mine = blocks_message(tensors, n_tensors);
    int *offsets;
    int64_t *all = blocks_gather(&s, &mine, &offsets);
    Layout l = {.chunk = xcalloc((size_t)n_tensors + 1, sizeof *l.chunk),
                .starts = xcalloc((size_t)ranks + 1, sizeof *l.starts)};
    bool ok = true;
    if (rank == 0) {
        Writers *w = writers_parse(&s, all, offsets, tensors, n_tensors);
        ok = layout_file(&s, tensors, n_tensors, w, attrs, n_attrs, &l);
        writers_free(w, n_tensors);
    }
    free(all), free(offsets), free(mine.v);
    ok = save_agree(&s, ok);
    if (ok) {
        Ints places = places_scatter(&s, &l, n_tensors);
        ok = chunks_write(&s, tensors, &l, &places);
        free(places.v);
    }
    free(l.places.v), free(l.starts), free(l.chunk);
    bool published = !ok || rank != 0 || publish_try(tmp, path);
    save_note_errno(&s, published);
    ok = ok && save_agree(&s, published);
    if (!ok) save_abandon(&s, err, errlen);
    return ok;
}

void ckpt_save_fail(const char *err, MPI_Comm comm) {
    int rank, ranks = ckpt_comm_ranks(comm, &rank);
    if (ranks == 1) die_user("%s", err);
    // Printed before the barrier: a rank that exits first may have the launcher stop the
    // others, rank 0 among them.
    if (rank == 0) log_user_error("%s", err);
    MPI_CHECK(MPI_Barrier(comm));
    exit(EXIT_USER_ERROR);
}

void ckpt_save(const char *path, const CkptTensor *tensors, int n_tensors, const CkptAttr *attrs,
               int n_attrs, MPI_Comm comm) {
    char err[2048];
    if (!ckpt_try_save(path, tensors, n_tensors, attrs, n_attrs, comm, err, sizeof err))
        ckpt_save_fail(err, comm);
}
