// Checkpoints: one HDF5 file per saved step, readable by h5py or h5dump as plain tensors.
//
// Layout: a float32 (little-endian) dataset per tensor at a caller-given path with its global
// shape ("/model/layers.0.attention.wq.weight", "/optimizer/exp_avg/<fqn>"), intermediate
// groups created as needed; scalar attributes on the root group (int64, double, UTF-8
// string) for step, config text, model args, data-loader position. The checkpoint knows
// nothing about models: callers list what to save and what to load.
//
// Distributed: in a job of several MPI ranks every rank of the saving communicator calls
// ckpt_save with the same list, each tensor's box being the part of the global tensor it holds
// (a rank whose box another replica writes writes nothing of it). Rank 0 lays the file out
// (datasets, chunk index, attributes) and every rank writes its own chunks into it, none
// waiting for another while it writes (checkpoint/save.c). ckpt_load reads, on each rank
// alone, only the boxes it lists, whatever layout wrote the file: loading reshards.
//
// Integrity: datasets are chunked (at most CKPT_CHUNK_FLOATS per chunk, each inside one
// writer's box) with HDF5's Fletcher32 checksum filter, which HDF5 verifies on every read, so a
// flipped byte fails the load in one line instead of training on garbage. A file is written as
// <path>.tmp by every rank, fsynced and renamed onto <path> by rank 0 (then the folder is
// fsynced), so a crash never leaves a partial file under a final name. Step files live in a
// folder as step-<N>.h5.
//
// Threads: HDF5 as Debian builds it for MPI is not thread-safe, so no two threads may be inside
// these functions at once. The trainer loads only at startup, before any save, and saves from
// one thread at a time (checkpoint/async.h: the background writer is the only caller while a
// save is in flight).
//
// Every failure a user can cause (missing, truncated or corrupt file, missing dataset, wrong
// shape, missing attribute) ends in one die_user line naming the file; HDF5's own error stack
// is silenced. The ckpt_try_* forms return that line instead of dying, for callers (and
// tests) that want to decide.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

#include "core/param.h"

typedef struct {
    const char *path;      // dataset path inside the file, e.g. "/model/norm.weight"
    int ndim;              // 1 .. CKPT_MAX_DIMS (a scalar is an attribute; a load reads 0 too)
    const int64_t *shape;  // (ndim) global shape
    float *data;           // (box->count) the box, row-major: read from on save, written on load
    // this rank's box (core/param.h: one range or several along each dim, PARAM_MAX_DIMS at
    // most), NULL: the whole tensor.
    const ParamBox *box;
    bool replica;          // save: another rank holds the same box and writes it
} CkptTensor;

#define CKPT_MAX_DIMS 8
// Chunks of about 4 MiB (checkpoint/chunk_grid.h), a checksum each.
#define CKPT_CHUNK_FLOATS ((int64_t)1 << 20)

typedef enum { CKPT_INT, CKPT_DOUBLE, CKPT_STRING } CkptAttrType;

typedef struct {
    const char *name;  // root-group attribute name; may contain dots ("model.dim")
    CkptAttrType type;
    int64_t i;         // CKPT_INT
    double d;          // CKPT_DOUBLE
    const char *s;     // CKPT_STRING, stored as a variable-length UTF-8 string
} CkptAttr;

// Writes every tensor and attribute to path atomically (see above), collectively over comm's
// ranks: MPI_COMM_WORLD for a save on the trainer's thread, a duplicate of it for a writer on
// another thread (whose collectives must not share a communicator with the first thread's),
// MPI_COMM_NULL for a process of one without MPI (tools, tests).
void ckpt_save(const char *path, const CkptTensor *tensors, int n_tensors, const CkptAttr *attrs,
               int n_attrs, MPI_Comm comm);
// ckpt_save without dying: a write that fails on any rank (a full disk: ENOSPC, EDQUOT, EIO)
// is agreed by every rank of comm, the partial <path>.tmp removed, and every rank returns
// false with the same line, naming the file, the reason and the bytes the save needs.
bool ckpt_try_save(const char *path, const CkptTensor *tensors, int n_tensors,
                   const CkptAttr *attrs, int n_attrs, MPI_Comm comm, char *err, size_t errlen);
// Every rank of comm (MPI_COMM_NULL: a process of one) with ckpt_try_save's line: rank 0
// prints it, then all exit 2 together.
__attribute__((noreturn)) void ckpt_save_fail(const char *err, MPI_Comm comm);

// The atomic write above, for any writer of checkpoint files (safetensors, config.json):
// tmp (tmplen) = "<path>.tmp", the folder of path created and a stale tmp removed; then, once
// tmp is written and closed, ckpt_publish fsyncs it, renames it onto path and fsyncs the folder.
void ckpt_tmp_prepare(const char *path, char *tmp, size_t tmplen);
void ckpt_publish(const char *tmp, const char *path);

// Fills every listed tensor's box; each dataset must exist with exactly the listed shape.
// While errors are collective (core/errors.h: the trainer's setup, where every rank loads),
// the job's ranks agree: one rank's failure stops them all with its line.
void ckpt_load(const char *path, const CkptTensor *tensors, int n_tensors);
// ckpt_load without dying: false and a one-line reason in err on any user-caused failure.
bool ckpt_try_load(const char *path, const CkptTensor *tensors, int n_tensors, char *err,
                   size_t errlen);

// Whether the file holds a dataset at dataset_path (e.g. optimizer state); dies on a bad file.
bool ckpt_has(const char *path, const char *dataset_path);

// Whether the file has a root attribute of that name; dies on a bad file.
bool ckpt_has_attr(const char *path, const char *attr);
// Root-group attributes; die_user if the file is bad or the attribute is missing or of
// another kind. ckpt_read_string returns a malloc'd string the caller frees.
int64_t ckpt_read_int(const char *path, const char *attr);
// The same, refusing (die_user naming file and attribute) a value outside [lo, hi]: a file a
// user hands over is input like a config, so a value the reader cannot use is their error.
int64_t ckpt_read_int_in(const char *path, const char *attr, int64_t lo, int64_t hi);
double ckpt_read_double(const char *path, const char *attr);
char *ckpt_read_string(const char *path, const char *attr);

// "<folder>/step-<step>.h5".
void ckpt_path_for_step(char *out, size_t outlen, const char *folder, int64_t step);
// Highest N with a complete <folder>/step-<N>.h5; -1 if none or no folder. Temporary files
// (step-N.h5.tmp) and other names are ignored.
int64_t ckpt_latest_step(const char *folder);
// Deletes the step-<N>.h5.tmp files in folder, saves a killed process left unfinished (every
// rank of a job calls it; rank 0 deletes). Returns how many rank 0 removed (0 elsewhere) and
// their names, comma-separated, in names (cut short to fit).
int ckpt_remove_unfinished(const char *folder, char *names, size_t nameslen);
// Deletes every complete step file but the `keep` latest (checkpoint.keep_latest_k); in a job
// of several ranks, every rank calls it and rank 0 deletes.
void ckpt_keep_latest(const char *folder, int keep);
