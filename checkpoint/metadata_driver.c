#include "checkpoint/metadata_driver.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/errors.h"

// HDF5 1.13 changed the driver table (a version and a value come first).
#if H5_VERSION_GE(1, 13, 0)
#error "checkpoint/metadata_driver.c implements HDF5 1.10-1.12's H5FD_class_t"
#endif

typedef struct {
    H5FD_t pub;  // HDF5's part, first
    int fd;
    haddr_t eoa, eof;
    dev_t device;
    ino_t inode;
} MetaFile;

static int first_errno;
static int open_errno;  // the last open's, while the last open failed
static bool drop_raw;
static int dropped;  // raw writes dropped since the last take, the last one's place:
static haddr_t dropped_addr;
static size_t dropped_size;

void metadata_driver_drop_raw(bool drop) { drop_raw = drop; }

bool metadata_driver_take_dropped(haddr_t *addr, size_t *size) {
    bool one = dropped == 1;
    *addr = dropped_addr, *size = dropped_size;
    dropped = 0;
    return one;
}

int metadata_driver_take_errno(void) {
    int e = first_errno ? first_errno : open_errno;
    first_errno = open_errno = 0;
    return e;
}

// Every failure of the driver: the system's errno kept for the save's line, -1 for HDF5.
static herr_t failed(void) {
    if (!first_errno) first_errno = errno ? errno : EIO;
    return -1;
}

static H5FD_t *meta_open(const char *name, unsigned flags, hid_t fapl, haddr_t maxaddr) {
    (void)fapl;
    (void)maxaddr;
    int oflags = flags & H5F_ACC_RDWR ? O_RDWR : O_RDONLY;
    if (flags & H5F_ACC_CREAT) oflags |= O_CREAT;
    if (flags & H5F_ACC_TRUNC) oflags |= O_TRUNC;
    if (flags & H5F_ACC_EXCL) oflags |= O_EXCL;
    int fd = open(name, oflags, 0666);
    struct stat st;
    // Not a failure of the file yet: HDF5 opens a file it creates first without creating it,
    // to see whether it exists. Kept only until an open succeeds.
    if (fd < 0 || fstat(fd, &st) != 0) {
        open_errno = errno;
        if (fd >= 0) close(fd);
        return NULL;
    }
    open_errno = 0;
    MetaFile *f = xcalloc(1, sizeof *f);
    *f = (MetaFile){.fd = fd, .eof = (haddr_t)st.st_size, .device = st.st_dev,
                    .inode = st.st_ino};
    return &f->pub;
}

static herr_t meta_close(H5FD_t *file) {
    MetaFile *f = (MetaFile *)file;
    herr_t rc = close(f->fd) == 0 ? 0 : failed();
    free(f);
    return rc;
}

static int meta_cmp(const H5FD_t *a, const H5FD_t *b) {
    const MetaFile *f = (const MetaFile *)a, *g = (const MetaFile *)b;
    if (f->device != g->device) return f->device < g->device ? -1 : 1;
    if (f->inode != g->inode) return f->inode < g->inode ? -1 : 1;
    return 0;
}

// sec2's features but small raw data's aggregation, which would pack small chunks of different
// ranks into one block: ranks then write the same pages (lock contention on a parallel file
// system), and each rank's chunks would no longer be one run of the file.
static herr_t meta_query(const H5FD_t *file, unsigned long *flags) {
    (void)file;
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA |
             H5FD_FEAT_DEFAULT_VFD_COMPATIBLE;
    return 0;
}

static haddr_t meta_get_eoa(const H5FD_t *file, H5FD_mem_t type) {
    (void)type;
    return ((const MetaFile *)file)->eoa;
}

static herr_t meta_set_eoa(H5FD_t *file, H5FD_mem_t type, haddr_t addr) {
    (void)type;
    ((MetaFile *)file)->eoa = addr;
    return 0;
}

static haddr_t meta_get_eof(const H5FD_t *file, H5FD_mem_t type) {
    (void)type;
    return ((const MetaFile *)file)->eof;
}

static herr_t meta_get_handle(H5FD_t *file, hid_t fapl, void **handle) {
    (void)fapl;
    *handle = &((MetaFile *)file)->fd;
    return 0;
}

// Past the end of the file reads zeros, as sec2's do.
static herr_t meta_read(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size,
                        void *buf) {
    (void)type;
    (void)dxpl;
    MetaFile *f = (MetaFile *)file;
    char *p = buf;
    while (size > 0) {
        ssize_t n = pread(f->fd, p, size, (off_t)addr);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return failed();
        if (n == 0) {
            memset(p, 0, size);
            break;
        }
        p += n, addr += (haddr_t)n, size -= (size_t)n;
    }
    return 0;
}

static herr_t meta_write(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size,
                         const void *buf) {
    (void)dxpl;
    MetaFile *f = (MetaFile *)file;
    if (type == H5FD_MEM_DRAW && drop_raw) {  // the chunks' ranks write them
        dropped++, dropped_addr = addr, dropped_size = size;
        return 0;
    }
    const char *p = buf;
    while (size > 0) {
        ssize_t n = pwrite(f->fd, p, size, (off_t)addr);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return failed();
        p += n, addr += (haddr_t)n, size -= (size_t)n;
    }
    if (addr > f->eof) f->eof = addr;
    return 0;
}

// The file's size becomes its end of allocation: the chunks' places included, as holes.
static herr_t meta_truncate(H5FD_t *file, hid_t dxpl, hbool_t closing) {
    (void)dxpl;
    (void)closing;
    MetaFile *f = (MetaFile *)file;
    if (f->eoa == f->eof) return 0;
    if (ftruncate(f->fd, (off_t)f->eoa) != 0) return failed();
    f->eof = f->eoa;
    return 0;
}

static const H5FD_class_t METADATA_DRIVER = {
    .name = "titan_metadata",
    .maxaddr = (haddr_t)INT64_MAX,
    .fc_degree = H5F_CLOSE_WEAK,
    .open = meta_open,
    .close = meta_close,
    .cmp = meta_cmp,
    .query = meta_query,
    .get_eoa = meta_get_eoa,
    .set_eoa = meta_set_eoa,
    .get_eof = meta_get_eof,
    .get_handle = meta_get_handle,
    .read = meta_read,
    .write = meta_write,
    .truncate = meta_truncate,
    .fl_map = H5FD_FLMAP_DICHOTOMY,
};

hid_t metadata_driver_fapl(void) {
    static hid_t driver = -1;
    if (driver < 0) H5_CHECK(driver = H5FDregister(&METADATA_DRIVER));
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5_CHECK(fapl);
    H5_CHECK(H5Pset_driver(fapl, driver, NULL));
    H5_CHECK(H5Pset_fclose_degree(fapl, H5F_CLOSE_SEMI));
    return fapl;
}
