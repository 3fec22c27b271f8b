#include "checkpoint/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <hdf5.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "core/errors.h"
#include "core/files.h"
#include "core/h5_string.h"

// HDF5 prints its whole error stack on every failure; titan reports one line of its own.
static void hdf5_silence(void) { H5_CHECK(H5Eset_auto2(H5E_DEFAULT, NULL, NULL)); }

// Closing semi-strictly makes H5Fclose fail if any object is still open, so a leaked id is
// caught at once instead of keeping the file silently open (and unflushed) behind our back.
static hid_t fapl_create(void) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5_CHECK(fapl);
    H5_CHECK(H5Pset_fclose_degree(fapl, H5F_CLOSE_SEMI));
    return fapl;
}

// Opens a checkpoint for reading, or returns -1 with the reason in err.
static hid_t file_open(const char *path, char *err, size_t errlen) {
    hdf5_silence();
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) error_set(err, errlen, "checkpoint file %s does not exist", path);
        else error_set(err, errlen, "cannot read checkpoint %s: %s", path, strerror(errno));
        return -1;
    }
    hid_t fapl = fapl_create();
    // HDF5 compares the file's size with the end address in its superblock, so a cut file
    // fails here; one damaged inside fails later, on read, with the same message.
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    H5_CHECK(H5Pclose(fapl));
    if (file < 0) error_set(err, errlen, "checkpoint %s is truncated or not an HDF5 file", path);
    return file;
}

static hid_t file_open_or_die(const char *path) {
    char err[1024];
    hid_t file = file_open(path, err, sizeof(err));
    if (file < 0) die_user("%s", err);
    return file;
}

// H5Lexists needs every parent link to exist, so walk the path one component at a time.
static bool object_exists(hid_t file, const char *path) {
    char prefix[1024];
    size_t len = strlen(path);
    CHECK(len < sizeof(prefix));
    for (size_t i = 1; i <= len; i++) {
        if (path[i] != '/' && path[i] != '\0') continue;
        memcpy(prefix, path, i);
        prefix[i] = '\0';
        if (H5Lexists(file, prefix, H5P_DEFAULT) <= 0) return false;
    }
    return true;
}

static void shape_format(char *out, size_t n, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(out, n, "(");
    for (int d = 0; d < ndim && used < n; d++)
        used += (size_t)snprintf(out + used, n - used, d ? ", %" PRId64 : "%" PRId64, shape[d]);
    if (used < n) snprintf(out + used, n - used, ")");
}

static bool dataset_check_shape(hid_t dset, const char *file_path, const CkptTensor *t,
                                char *err, size_t errlen) {
    hid_t space = H5Dget_space(dset);
    H5_CHECK(space);
    hsize_t dims[H5S_MAX_RANK];
    int ndim = H5Sget_simple_extent_dims(space, dims, NULL);
    H5_CHECK(ndim);
    H5_CHECK(H5Sclose(space));
    bool same = ndim == t->ndim;
    int64_t found[H5S_MAX_RANK];
    for (int d = 0; d < ndim; d++) {
        found[d] = (int64_t)dims[d];
        same = same && found[d] == t->shape[d];
    }
    if (same) return true;
    char have[256], want[256];
    shape_format(have, sizeof(have), ndim, found);
    shape_format(want, sizeof(want), t->ndim, t->shape);
    return error_set(err, errlen, "checkpoint %s: %s has shape %s but the model expects %s", file_path,
                t->path, have, want);
}

static bool dataset_is_float(hid_t dset) {
    hid_t type = H5Dget_type(dset);
    H5_CHECK(type);
    H5T_class_t cls = H5Tget_class(type);
    H5_CHECK(H5Tclose(type));
    return cls == H5T_FLOAT;
}

// Selects box b in space: one hyperslab per combination of a range along each dim, OR'ed.
// HDF5 moves a selection's elements in the dataspace's row-major order, which is the box's
// local order since each dim's ranges increase (one range per dim: one plain hyperslab).
static void box_hyperslabs(hid_t space, const ParamBox *b) {
    int at[PARAM_MAX_DIMS] = {0};  // the range taken along each dim
    H5S_seloper_t op = H5S_SELECT_SET;
    for (bool more = true; more; op = H5S_SELECT_OR) {
        hsize_t start[PARAM_MAX_DIMS], count[PARAM_MAX_DIMS];
        for (int d = 0; d < b->ndim; d++) {
            start[d] = (hsize_t)b->ranges[d].start[at[d]];
            count[d] = (hsize_t)b->ranges[d].count[at[d]];
        }
        H5_CHECK(H5Sselect_hyperslab(space, op, start, NULL, count, NULL));
        more = false;  // the next combination, the last dim's range fastest
        for (int d = b->ndim - 1; d >= 0 && !more; d--) {
            more = ++at[d] < b->ranges[d].n;
            if (!more) at[d] = 0;
        }
    }
}

// The file's and memory's selections for t's box: the whole tensor, the box's hyperslabs, or
// nothing (an empty box: FSDP's last ranks may hold no rows; a replica that another rank
// writes). file_space is the dataset's; *file_sel is it (with the box selected) or H5S_ALL.
static void box_select(const CkptTensor *t, bool none, hid_t file_space, hid_t *file_sel,
                       hid_t *mem_space) {
    if (t->ndim == 0 || (!t->box && !none)) {
        *file_sel = *mem_space = H5S_ALL;
        return;
    }
    CHECK(!t->box || t->box->ndim == t->ndim);
    hsize_t count[CKPT_MAX_DIMS];
    hsize_t elements = 1;
    for (int d = 0; d < t->ndim; d++) {
        count[d] = t->box ? (hsize_t)t->box->count[d] : (hsize_t)t->shape[d];
        elements *= count[d];
    }
    *file_sel = file_space;
    H5_CHECK(*mem_space = H5Screate_simple(t->ndim, count, NULL));
    if (none || elements == 0) {
        H5_CHECK(H5Sselect_none(file_space));
        H5_CHECK(H5Sselect_none(*mem_space));
    } else {
        box_hyperslabs(file_space, t->box);
    }
}

static void spaces_close(hid_t file_space, hid_t mem_space) {
    if (mem_space != H5S_ALL) H5_CHECK(H5Sclose(mem_space));
    H5_CHECK(H5Sclose(file_space));
}

// Whether HDF5's error stack holds a filter (pipeline) failure: Fletcher32's mismatch.
static herr_t find_filter_error(unsigned n, const H5E_error2_t *e, void *found) {
    (void)n;
    if (e->maj_num == H5E_PLINE) *(bool *)found = true;
    return 0;
}

static bool read_failed_in_filter(void) {
    bool found = false;
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, find_filter_error, &found);
    return found;
}

static bool box_read(hid_t dset, const char *file_path, const CkptTensor *t, char *err,
                     size_t errlen) {
    hid_t file_space = H5Dget_space(dset), file_sel, mem_space;
    H5_CHECK(file_space);
    box_select(t, false, file_space, &file_sel, &mem_space);
    bool ok = H5Dread(dset, H5T_NATIVE_FLOAT, mem_space, file_sel, H5P_DEFAULT, t->data) >= 0;
    if (!ok && read_failed_in_filter())
        error_set(err, errlen, "checkpoint %s: %s fails its Fletcher32 checksum (the file is "
                  "corrupt)", file_path, t->path);
    else if (!ok)
        error_set(err, errlen, "checkpoint %s is truncated or corrupt (reading %s failed)",
                  file_path, t->path);
    spaces_close(file_space, mem_space);
    return ok;
}

static bool tensor_load(hid_t file, const char *file_path, const CkptTensor *t, char *err,
                        size_t errlen) {
    if (!object_exists(file, t->path))
        return error_set(err, errlen, "checkpoint %s has no dataset %s", file_path, t->path);
    hid_t dset = H5Dopen2(file, t->path, H5P_DEFAULT);
    if (dset < 0)
        return error_set(err, errlen, "checkpoint %s: %s is not a readable dataset", file_path, t->path);
    bool ok = dataset_check_shape(dset, file_path, t, err, errlen);
    if (ok && !dataset_is_float(dset))
        ok = error_set(err, errlen, "checkpoint %s: %s is not a floating-point dataset", file_path,
                  t->path);
    ok = ok && box_read(dset, file_path, t, err, errlen);
    H5_CHECK(H5Dclose(dset));
    return ok;
}

bool ckpt_try_load(const char *path, const CkptTensor *tensors, int n_tensors, char *err,
                   size_t errlen) {
    hid_t file = file_open(path, err, errlen);
    if (file < 0) return false;
    bool ok = true;
    for (int i = 0; i < n_tensors && ok; i++)
        ok = tensor_load(file, path, &tensors[i], err, errlen);
    H5_CHECK(H5Fclose(file));
    return ok;
}

// This process's rank among comm's ranks and their number; MPI_COMM_NULL: a job of one.
static int comm_ranks(MPI_Comm comm, int *rank) {
    int size = 1;
    *rank = 0;
    if (comm == MPI_COMM_NULL) return 1;
    MPI_CHECK(MPI_Comm_rank(comm, rank));
    MPI_CHECK(MPI_Comm_size(comm, &size));
    return size;
}

// This process's rank in the job and the job's size: MPI's world once MPI runs (the trainer),
// else a job of one (tools, tests).
static int job_ranks(int *rank) {
    int initialized = 0, finalized = 0;
    MPI_CHECK(MPI_Initialized(&initialized));
    MPI_CHECK(MPI_Finalized(&finalized));
    return comm_ranks(initialized && !finalized ? MPI_COMM_WORLD : MPI_COMM_NULL, rank);
}

// A rank may fail alone (a corrupt chunk that only its box covers) while the others go on into
// the job's first collective. While errors are collective (core/errors.h: the trainer's
// setup, where every rank loads and only rank 0 prints) the ranks therefore agree, and every
// one dies with the line of the lowest failing rank; a load by one rank alone (rank 0 reading
// a step file back for the Hugging Face export) happens after setup and dies where it fails.
void ckpt_load(const char *path, const CkptTensor *tensors, int n_tensors) {
    char err[1024];
    bool ok = ckpt_try_load(path, tensors, n_tensors, err, sizeof(err));
    int rank, ranks = job_ranks(&rank);
    if (ranks > 1 && die_user_is_collective()) {
        int failed = ok ? ranks : rank;
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
        if (failed == ranks) return;
        MPI_CHECK(MPI_Bcast(err, sizeof(err), MPI_CHAR, failed, MPI_COMM_WORLD));
        ok = false;
    }
    if (!ok) die_user("%s", err);
}

bool ckpt_has(const char *path, const char *dataset_path) {
    hid_t file = file_open_or_die(path);
    bool found = object_exists(file, dataset_path);
    H5_CHECK(H5Fclose(file));
    return found;
}

// Chunks of whole trailing dims up to CKPT_CHUNK_FLOATS, so each checksum covers a few MiB and
// a box of rows reads only its chunks.
static hid_t dataset_create_plist(const CkptTensor *t) {
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5_CHECK(dcpl);
    H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));  // every element is written
    if (t->ndim == 0) return dcpl;  // a scalar cannot be chunked
    hsize_t chunk[CKPT_MAX_DIMS];
    int64_t budget = CKPT_CHUNK_FLOATS;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d] < budget ? t->shape[d] : budget;
        chunk[d] = (hsize_t)(n > 0 ? n : 1);
        budget = budget / (int64_t)chunk[d] > 0 ? budget / (int64_t)chunk[d] : 1;
    }
    H5_CHECK(H5Pset_chunk(dcpl, t->ndim, chunk));
    H5_CHECK(H5Pset_fletcher32(dcpl));
    return dcpl;
}

// A save in progress on one rank: the communicator its ranks agree over (MPI_COMM_NULL: a
// process of one) and its failure, 0 while none: the errno of a disk error (ENOSPC, EDQUOT,
// EIO...) when HDF5's error stack or errno names one, else 1.
typedef struct {
    MPI_Comm comm;
    int failure;
    off_t bound;          // the file's size at most (save_file_bound)
    const char *tmp;      // the file being written
} Save;

// How long a rank whose write failed waits for the others to agree (ckpt_set_failure_wait).
static int failure_wait_seconds = 100;

void ckpt_set_failure_wait(int seconds) { failure_wait_seconds = seconds; }

static void save_failure_line(const Save *s, char *err, size_t errlen);

// The errno of a failed write in HDF5's error stack: the POSIX driver says "errno = N", the
// MPI-IO driver names MPI's error class.
static herr_t find_disk_error(unsigned n, const H5E_error2_t *e, void *found) {
    (void)n;
    const char *d = e->desc ? e->desc : "", *at = strstr(d, "errno = ");
    int *code = found;
    if (at && !*code) *code = atoi(at + 8);
    if (strstr(d, "MPI_ERR_NO_SPACE") && !*code) *code = ENOSPC;
    if (strstr(d, "MPI_ERR_QUOTA") && !*code) *code = EDQUOT;
    if (strstr(d, "MPI_ERR_IO") && !*code) *code = EIO;
    return 0;
}

// The others never came to the agreement of a rank whose write failed: they wait inside the
// parallel-HDF5 collective its failure broke (a write that fails on one rank returns there
// alone, halfway through the collective: an EIO after the space was reserved), where nothing
// but the end of the job frees them. This rank removes the partial file, prints the save's
// line and ends the job with exit 2.
__attribute__((noreturn)) static void save_stuck(const Save *s) {
    char err[2048];
    unlink(s->tmp);
    save_failure_line(s, err, sizeof err);
    log_user_error("%s; the other ranks did not return from the write within %d s", err,
                   failure_wait_seconds);
    MPI_Abort(MPI_COMM_WORLD, EXIT_USER_ERROR);
    exit(EXIT_USER_ERROR);
}

// Records a failed HDF5 call (ok false) of the save, with the disk's reason when known, then
// agrees with every rank of the save: all go on, or all stop together, whichever rank failed.
// HDF5's collectives run on its own duplicate of comm, so this reduction never meets one of
// them. Each rank comes here after the same HDF5 calls, which return on every rank when the
// file system refuses a call everywhere (a full disk, found by the space reservation); a rank
// whose write failed alone waits failure_wait_seconds for the others, then ends the job
// (save_stuck). The reduction is nonblocking on every rank (a blocking one would not match).
static bool save_agree(Save *s, bool ok) {
    if (!ok && !s->failure) {
        int code = 0;
        H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, find_disk_error, &code);
        s->failure = code > 0 ? code : errno > 0 ? errno : 1;
    }
    if (s->comm == MPI_COMM_NULL) return s->failure == 0;
    bool failed_here = s->failure != 0;
    MPI_Request request;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, &s->failure, 1, MPI_INT, MPI_MAX, s->comm, &request));
    struct timespec start, now, pause = {.tv_nsec = 10000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (int done = 0;;) {
        MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
        if (done) break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (failed_here && now.tv_sec - start.tv_sec >= failure_wait_seconds) save_stuck(s);
        // From 10 us doubling up to 1 ms: quick for the agreements a save makes per tensor, and
        // the core freed for the ranks still writing.
        nanosleep(&pause, NULL);
        if (pause.tv_nsec < 1000000) pause.tv_nsec *= 2;
    }
    return s->failure == 0;
}

// Writes t as a dataset; false (agreed by every rank) if the file could not take it. After a
// failure what was opened is closed, errors ignored: the file is abandoned.
static bool tensor_write(Save *s, hid_t file, hid_t lcpl, hid_t dxpl, const CkptTensor *t) {
    CHECK(t->ndim >= 0 && t->ndim <= CKPT_MAX_DIMS);
    hsize_t dims[CKPT_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) {
        CHECK(t->shape[d] >= 1);
        dims[d] = (hsize_t)t->shape[d];
    }
    hid_t space = t->ndim ? H5Screate_simple(t->ndim, dims, NULL) : H5Screate(H5S_SCALAR);
    H5_CHECK(space);
    hid_t dcpl = dataset_create_plist(t);
    hid_t dset = H5Dcreate2(file, t->path, H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT);
    bool ok = save_agree(s, dset >= 0);
    if (ok) {
        hid_t file_space = H5Dget_space(dset), file_sel, mem_space;
        H5_CHECK(file_space);
        box_select(t, t->replica, file_space, &file_sel, &mem_space);
        herr_t wrote = H5Dwrite(dset, H5T_NATIVE_FLOAT, mem_space, file_sel, dxpl, t->data);
        ok = save_agree(s, wrote >= 0);
        spaces_close(file_space, mem_space);
    }
    // Closing writes the dataset's last chunks out, a failure of its own; every rank agrees
    // once more whether or not its create succeeded.
    bool closed = dset < 0 || H5Dclose(dset) >= 0;
    ok = save_agree(s, closed || !ok) && ok;
    H5_CHECK(H5Pclose(dcpl));
    H5_CHECK(H5Sclose(space));
    return ok;
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

static bool attr_write(Save *s, hid_t file, const CkptAttr *a) {
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
    return save_agree(s, ok);
}

static void dir_of(const char *path, char *out, size_t n) {
    const char *slash = strrchr(path, '/');
    size_t len = slash ? (size_t)(slash - path) : 0;
    if (!slash) snprintf(out, n, ".");
    else if (len == 0) snprintf(out, n, "/");
    else snprintf(out, n, "%.*s", (int)len, path);
}

static void fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    SYS_CHECK(fd);
    SYS_CHECK(fsync(fd));
    SYS_CHECK(close(fd));
}

// The checkpoint's data: every tensor once, as float32.
static double save_bytes(const CkptTensor *tensors, int n_tensors) {
    double bytes = 0;
    for (int i = 0; i < n_tensors; i++) {
        double n = 4;
        for (int d = 0; d < tensors[i].ndim; d++) n *= (double)tensors[i].shape[d];
        bytes += n;
    }
    return bytes;
}

// A bound on the file's size: the data, a Fletcher32 checksum and index entry per chunk, an
// object header per dataset and the attributes (the config), with room to spare.
static off_t save_file_bound(const CkptTensor *tensors, int n_tensors, const CkptAttr *attrs,
                             int n_attrs) {
    double data = save_bytes(tensors, n_tensors), chunks = data / (4.0 * CKPT_CHUNK_FLOATS);
    double bound = data + (chunks + n_tensors) * 64.0 + n_tensors * 16384.0 + (1 << 20);
    for (int i = 0; i < n_attrs; i++)
        bound += 1024.0 + (attrs[i].type == CKPT_STRING ? (double)strlen(attrs[i].s) : 8);
    return (off_t)(bound * 1.01);
}

// Reserves the file's space on disk, beyond its end (its size unchanged), before any rank
// writes: parallel HDF5 may fail a write on one rank alone, halfway through a collective the
// others then wait in forever (issue 30), so a disk too full for the checkpoint must be found
// here, where the ranks can still agree. 0, or the errno (ENOSPC, EDQUOT, EIO). A file system
// that cannot reserve is asked for its free space instead.
static int space_reserve(const char *tmp, off_t bytes) {
    int fd = open(tmp, O_WRONLY);
    if (fd < 0) return errno;
    int rc = fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, bytes) == 0 ? 0 : errno;
    close(fd);
    struct statvfs fs;
    if ((rc == EOPNOTSUPP || rc == ENOSYS) && statvfs(tmp, &fs) == 0)
        rc = (double)fs.f_bavail * fs.f_frsize < (double)bytes ? ENOSPC : 0;
    return rc;
}

// The reservation's part beyond the file's end, given back once the file is complete.
static void space_release(int fd) {
    struct stat st;
    if (fstat(fd, &st) == 0)
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, st.st_size, (off_t)1 << 40);
}

// Every rank creates the file together and writes its boxes in collective MPI-IO transfers
// (which parallel HDF5 needs for filtered datasets); the metadata calls are collective too,
// so every rank passes the same list.
static bool file_write(Save *s, const char *tmp, const CkptTensor *tensors, int n_tensors,
                       const CkptAttr *attrs, int n_attrs) {
    hid_t fapl = fapl_create(), dxpl = H5Pcreate(H5P_DATASET_XFER);
    H5_CHECK(dxpl);
    if (s->comm != MPI_COMM_NULL) {
        H5_CHECK(H5Pset_fapl_mpio(fapl, s->comm, MPI_INFO_NULL));
        H5_CHECK(H5Pset_all_coll_metadata_ops(fapl, true));
        H5_CHECK(H5Pset_coll_metadata_write(fapl, true));
        H5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
    }
    s->bound = save_file_bound(tensors, n_tensors, attrs, n_attrs);
    // A file one rank could not create is left open on the others (their close is collective):
    // the job ends after a failed save, and HDF5's exit handler is off (train/main.c).
    hid_t file = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    if (!save_agree(s, file >= 0)) {
        H5_CHECK(H5Pclose(dxpl));
        H5_CHECK(H5Pclose(fapl));
        return false;
    }
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5_CHECK(lcpl);
    H5_CHECK(H5Pset_create_intermediate_group(lcpl, 1));
    int rank = 0;
    if (s->comm != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_rank(s->comm, &rank));
    int reserved = rank == 0 ? space_reserve(tmp, s->bound) : 0;
    errno = reserved;
    bool ok = save_agree(s, reserved == 0);
    for (int i = 0; i < n_tensors && ok; i++) ok = tensor_write(s, file, lcpl, dxpl, &tensors[i]);
    for (int i = 0; i < n_attrs && ok; i++) ok = attr_write(s, file, &attrs[i]);
    H5_CHECK(H5Pclose(lcpl));
    // Closing flushes the metadata; after a failure it is still called, on every rank, to free
    // what the file holds (its MPI-IO handle among them).
    ok = save_agree(s, H5Fclose(file) >= 0 || !ok) && ok;
    H5_CHECK(H5Pclose(dxpl));
    H5_CHECK(H5Pclose(fapl));
    return ok;
}

void ckpt_tmp_prepare(const char *path, char *tmp, size_t tmplen) {
    char dir[1024];
    dir_of(path, dir, sizeof(dir));
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
    dir_of(path, dir, sizeof(dir));
    // Data on disk before the name points at it, and the rename itself made durable.
    fsync_path(tmp);
    SYS_CHECK(rename(tmp, path));
    fsync_path(dir);
}

// ckpt_publish, reporting a failure (its errno kept) instead of dying.
static bool publish_try(const char *tmp, const char *path) {
    char dir[1024];
    dir_of(path, dir, sizeof(dir));
    int fd = open(tmp, O_WRONLY);
    if (fd < 0) return false;
    space_release(fd);
    bool ok = fsync(fd) == 0;
    ok = close(fd) == 0 && ok && rename(tmp, path) == 0;
    int dir_fd = ok ? open(dir, O_RDONLY) : -1;
    if (dir_fd < 0) return false;
    ok = fsync(dir_fd) == 0;
    return close(dir_fd) == 0 && ok;
}

// The errno the line names: the disk's when HDF5 passed it on, else ENOSPC when the folder is
// short of the save's space; 1 when neither is known.
static int failure_errno(int failure, bool short_of_space) {
    return failure == ENOSPC || (failure != EDQUOT && short_of_space) ? ENOSPC : failure;
}

// The line of a failed save: the reason, the file, what the save needs and what its folder
// has (once the partial file is gone).
static void save_failure_line(const Save *s, char *err, size_t errlen) {
    char dir[1024];
    dir_of(s->tmp, dir, sizeof dir);
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
static void save_abandon(const Save *s, int rank, char *err, size_t errlen) {
    if (rank == 0) {
        unlink(s->tmp);
        save_failure_line(s, err, errlen);
    }
    if (s->comm != MPI_COMM_NULL)  // after the unlink: no rank goes on (or exits) before it
        MPI_CHECK(MPI_Bcast(err, (int)errlen, MPI_CHAR, 0, s->comm));
}

// Rank 0 prepares the folder and publishes the file; the barrier and the agreement on the
// publication order those steps with every rank's part of the write, so no rank goes on (and
// no later save or deletion starts) before the checkpoint is complete under its name. A
// failed write (a full disk) is agreed by every rank, which then all return false with the
// same line.
bool ckpt_try_save(const char *path, const CkptTensor *tensors, int n_tensors,
                   const CkptAttr *attrs, int n_attrs, MPI_Comm comm, char *err, size_t errlen) {
    hdf5_silence();
    int rank, ranks = comm_ranks(comm, &rank);
    char tmp[1024];
    if (rank == 0) ckpt_tmp_prepare(path, tmp, sizeof(tmp));
    else CHECK(snprintf(tmp, sizeof tmp, "%s.tmp", path) < (int)sizeof tmp);
    Save s = {.comm = ranks > 1 ? comm : MPI_COMM_NULL, .tmp = tmp};
    if (ranks > 1) MPI_CHECK(MPI_Barrier(comm));
    bool ok = file_write(&s, tmp, tensors, n_tensors, attrs, n_attrs);
    ok = ok && save_agree(&s, rank != 0 || publish_try(tmp, path));
    if (!ok) save_abandon(&s, rank, err, errlen);
    return ok;
}

void ckpt_save_fail(const char *err, MPI_Comm comm) {
    int rank, ranks = comm_ranks(comm, &rank);
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

bool ckpt_has_attr(const char *path, const char *attr) {
    hid_t file = file_open_or_die(path);
    bool found = H5Aexists(file, attr) > 0;
    H5_CHECK(H5Fclose(file));
    return found;
}

// Opens a root attribute of the given class, dying with a line naming what is wrong.
static hid_t attr_open(hid_t file, const char *path, const char *name, H5T_class_t cls) {
    if (H5Aexists(file, name) <= 0) die_user("checkpoint %s has no attribute %s", path, name);
    hid_t attr = H5Aopen(file, name, H5P_DEFAULT);
    if (attr < 0) die_user("checkpoint %s is truncated or corrupt (attribute %s)", path, name);
    hid_t type = H5Aget_type(attr), space = H5Aget_space(attr);
    H5_CHECK(type);
    H5_CHECK(space);
    bool ok = H5Tget_class(type) == cls && H5Sget_simple_extent_npoints(space) == 1;
    H5_CHECK(H5Tclose(type));
    H5_CHECK(H5Sclose(space));
    const char *kind = cls == H5T_INTEGER ? "integer" : cls == H5T_FLOAT ? "number" : "string";
    if (!ok) die_user("checkpoint %s: attribute %s is not a single %s", path, name, kind);
    return attr;
}

static void attr_read_scalar(const char *path, const char *name, H5T_class_t cls, hid_t mem_type,
                             void *out) {
    hid_t file = file_open_or_die(path);
    hid_t attr = attr_open(file, path, name, cls);
    if (H5Aread(attr, mem_type, out) < 0)
        die_user("checkpoint %s is truncated or corrupt (attribute %s)", path, name);
    H5_CHECK(H5Aclose(attr));
    H5_CHECK(H5Fclose(file));
}

int64_t ckpt_read_int(const char *path, const char *attr) {
    int64_t v;
    attr_read_scalar(path, attr, H5T_INTEGER, H5T_NATIVE_INT64, &v);
    return v;
}

int64_t ckpt_read_int_in(const char *path, const char *attr, int64_t lo, int64_t hi) {
    int64_t v = ckpt_read_int(path, attr);
    if (v < lo || v > hi)
        die_user("checkpoint %s: attribute %s is %" PRId64 ", outside [%" PRId64 ", %" PRId64 "]",
                 path, attr, v, lo, hi);
    return v;
}

double ckpt_read_double(const char *path, const char *attr) {
    double v;
    attr_read_scalar(path, attr, H5T_FLOAT, H5T_NATIVE_DOUBLE, &v);
    return v;
}

char *ckpt_read_string(const char *path, const char *attr) {
    hid_t file = file_open_or_die(path);
    hid_t a = attr_open(file, path, attr, H5T_STRING);
    char *s = h5_string_read(a, H5S_ALL);
    if (!s) die_user("checkpoint %s is truncated or corrupt (attribute %s)", path, attr);
    H5_CHECK(H5Aclose(a));
    H5_CHECK(H5Fclose(file));
    return s;
}

void ckpt_path_for_step(char *out, size_t outlen, const char *folder, int64_t step) {
    int n = snprintf(out, outlen, "%s/step-%" PRId64 ".h5", folder, step);
    CHECK(n >= 0 && (size_t)n < outlen);
}

// "step-<digits>.h5" exactly; anything else (step-9.h5.tmp, notes.txt) is not a checkpoint.
static bool step_parse(const char *name, int64_t *step) {
    if (strncmp(name, "step-", 5) != 0 || name[5] < '0' || name[5] > '9') return false;
    char *end;
    errno = 0;
    long long v = strtoll(name + 5, &end, 10);
    if (errno != 0 || strcmp(end, ".h5") != 0) return false;
    *step = v;
    return true;
}

// The k-th highest complete step in folder (k = 1: the latest); -1 if there are fewer than k.
static int64_t kth_latest_step(const char *folder, int k) {
    DIR *dir = opendir(folder);
    if (!dir) {
        if (errno == ENOENT) return -1;
        die_user("cannot read checkpoint folder %s: %s", folder, strerror(errno));
    }
    int64_t below = INT64_MAX, kth = -1, step;
    for (int rank = 0; rank < k; rank++, below = kth) {
        kth = -1;
        rewinddir(dir);
        for (struct dirent *e; (e = readdir(dir));)
            if (step_parse(e->d_name, &step) && step < below && step > kth) kth = step;
        if (kth < 0) break;
    }
    SYS_CHECK(closedir(dir));
    return kth;
}

int64_t ckpt_latest_step(const char *folder) { return kth_latest_step(folder, 1); }

// "step-<digits>.h5.tmp", the name ckpt_save writes before it publishes: a save that never
// finished (its process killed mid-write).
static bool unfinished_parse(const char *name) {
    size_t n = strlen(name);
    char stem[256];
    int64_t step;
    if (n <= 4 || n - 4 >= sizeof stem || strcmp(name + n - 4, ".tmp") != 0) return false;
    memcpy(stem, name, n - 4);
    stem[n - 4] = '\0';
    return step_parse(stem, &step);
}

int ckpt_remove_unfinished(const char *folder, char *names, size_t nameslen) {
    int rank, removed = 0;
    job_ranks(&rank);
    if (nameslen) names[0] = '\0';
    if (rank != 0) return 0;
    DIR *dir = opendir(folder);
    if (!dir) {
        if (errno == ENOENT) return 0;
        die_user("cannot read checkpoint folder %s: %s", folder, strerror(errno));
    }
    char path[4096];
    for (struct dirent *e; (e = readdir(dir));) {
        if (!unfinished_parse(e->d_name)) continue;
        CHECK(snprintf(path, sizeof path, "%s/%s", folder, e->d_name) < (int)sizeof path);
        if (unlink(path) != 0)
            die_user("cannot remove the unfinished save %s: %s", path, strerror(errno));
        size_t used = strlen(names);
        snprintf(names + used, nameslen - used, "%s%s", removed ? ", " : "", e->d_name);
        removed++;
    }
    SYS_CHECK(closedir(dir));
    return removed;
}

// Every rank of a job calls this after the same save; rank 0 alone deletes, as it alone
// publishes, so that two ranks never race to unlink the same file.
void ckpt_keep_latest(const char *folder, int keep) {
    int rank;
    job_ranks(&rank);
    if (rank != 0) return;
    int64_t oldest_kept = kth_latest_step(folder, keep);
    if (oldest_kept < 0) return;
    DIR *dir = opendir(folder);
    if (!dir) die_user("cannot read checkpoint folder %s: %s", folder, strerror(errno));
    int64_t step;
    char path[4096];
    for (struct dirent *e; (e = readdir(dir));) {
        if (!step_parse(e->d_name, &step) || step >= oldest_kept) continue;
        ckpt_path_for_step(path, sizeof path, folder, step);
        SYS_CHECK(unlink(path));
    }
    SYS_CHECK(closedir(dir));
}
