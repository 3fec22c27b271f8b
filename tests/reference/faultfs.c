// A file system that fails writes on purpose, for tests/integration/test_disk_errors.sh:
//   faultfs BACKING MOUNTPOINT ERRNO TEXT OFFSET
// Mounts BACKING's files at MOUNTPOINT (FUSE, in the foreground until unmounted) and passes
// every call through, except a write to a file whose path contains TEXT that reaches past
// byte OFFSET of it: that one fails with ERRNO (EIO, ENOSPC or EDQUOT), as a disk that dies
// (or fills) at that spot would, while statfs still reports the backing folder's free space
// and fallocate is not offered (EOPNOTSUPP), so a space reservation ahead of the write cannot
// see it coming. The error comes back through the kernel's own write path, to whichever
// process wrote, which is what no tmpfs can do: an EIO in the middle of a collective HDF5
// write on the rank that writes there.
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse3/fuse.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <unistd.h>

static const char *backing, *text;
static int fault_errno;
static off_t fault_offset;

// The backing folder's path for a path under the mount point.
static void real_path(char out[PATH_MAX], const char *path) {
    snprintf(out, PATH_MAX, "%s%s", backing, path);
}

static int fs_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    char p[PATH_MAX];
    real_path(p, path);
    int rc = fi ? fstat((int)fi->fh, st) : lstat(p, st);
    return rc == 0 ? 0 : -errno;
}

static int fs_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                      struct fuse_file_info *fi, enum fuse_readdir_flags flags) {
    (void)off, (void)fi, (void)flags;
    char p[PATH_MAX];
    real_path(p, path);
    DIR *d = opendir(p);
    if (!d) return -errno;
    for (struct dirent *e; (e = readdir(d));) fill(buf, e->d_name, NULL, 0, 0);
    closedir(d);
    return 0;
}

static int fs_unlink(const char *path) {
    char p[PATH_MAX];
    real_path(p, path);
    return unlink(p) == 0 ? 0 : -errno;
}

static int fs_rmdir(const char *path) {
    char p[PATH_MAX];
    real_path(p, path);
    return rmdir(p) == 0 ? 0 : -errno;
}

static int fs_mkdir(const char *path, mode_t mode) {
    char p[PATH_MAX];
    real_path(p, path);
    return mkdir(p, mode) == 0 ? 0 : -errno;
}

static int fs_rename(const char *from, const char *to, unsigned flags) {
    if (flags) return -EINVAL;
    char a[PATH_MAX], b[PATH_MAX];
    real_path(a, from);
    real_path(b, to);
    return rename(a, b) == 0 ? 0 : -errno;
}

static int fs_truncate(const char *path, off_t size, struct fuse_file_info *fi) {
    char p[PATH_MAX];
    real_path(p, path);
    int rc = fi ? ftruncate((int)fi->fh, size) : truncate(p, size);
    return rc == 0 ? 0 : -errno;
}

static int fs_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi) {
    char p[PATH_MAX];
    real_path(p, path);
    int rc = fi ? futimens((int)fi->fh, tv) : utimensat(AT_FDCWD, p, tv, AT_SYMLINK_NOFOLLOW);
    return rc == 0 ? 0 : -errno;
}

static int fs_chmod(const char *path, mode_t mode, struct fuse_file_info *fi) {
    char p[PATH_MAX];
    real_path(p, path);
    int rc = fi ? fchmod((int)fi->fh, mode) : chmod(p, mode);
    return rc == 0 ? 0 : -errno;
}

static int fs_open(const char *path, struct fuse_file_info *fi) {
    char p[PATH_MAX];
    real_path(p, path);
    int fd = open(p, fi->flags);
    if (fd < 0) return -errno;
    fi->fh = (uint64_t)fd;
    return 0;
}

static int fs_create(const char *path, mode_t mode, struct fuse_file_info *fi) {
    char p[PATH_MAX];
    real_path(p, path);
    int fd = open(p, fi->flags, mode);
    if (fd < 0) return -errno;
    fi->fh = (uint64_t)fd;
    return 0;
}

static int fs_read(const char *path, char *buf, size_t n, off_t off, struct fuse_file_info *fi) {
    (void)path;
    ssize_t got = pread((int)fi->fh, buf, n, off);
    return got >= 0 ? (int)got : -errno;
}

static bool faulty(const char *path, size_t n, off_t off) {
    return strstr(path, text) && off + (off_t)n > fault_offset;
}

static int fs_write(const char *path, const char *buf, size_t n, off_t off,
                    struct fuse_file_info *fi) {
    if (faulty(path, n, off)) return -fault_errno;
    ssize_t put = pwrite((int)fi->fh, buf, n, off);
    return put >= 0 ? (int)put : -errno;
}

static int fs_fsync(const char *path, int datasync, struct fuse_file_info *fi) {
    (void)path;
    int rc = datasync ? fdatasync((int)fi->fh) : fsync((int)fi->fh);
    return rc == 0 ? 0 : -errno;
}

static int fs_release(const char *path, struct fuse_file_info *fi) {
    (void)path;
    close((int)fi->fh);
    return 0;
}

static int fs_statfs(const char *path, struct statvfs *st) {
    char p[PATH_MAX];
    real_path(p, path);
    return statvfs(p, st) == 0 ? 0 : -errno;
}

static void *fs_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    (void)conn;
    cfg->direct_io = 1;  // every write reaches fs_write, at the writer's offset and size
    cfg->attr_timeout = 0;
    cfg->entry_timeout = 0;
    return NULL;
}

static const struct fuse_operations ops = {
    .init = fs_init, .getattr = fs_getattr, .readdir = fs_readdir, .mkdir = fs_mkdir,
    .unlink = fs_unlink, .rmdir = fs_rmdir, .rename = fs_rename, .truncate = fs_truncate,
    .utimens = fs_utimens, .chmod = fs_chmod, .open = fs_open, .create = fs_create,
    .read = fs_read, .write = fs_write, .fsync = fs_fsync, .release = fs_release,
    .statfs = fs_statfs,
};

static int errno_named(const char *name) {
    if (!strcmp(name, "EIO")) return EIO;
    if (!strcmp(name, "ENOSPC")) return ENOSPC;
    if (!strcmp(name, "EDQUOT")) return EDQUOT;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 6 || !(fault_errno = errno_named(argv[3]))) {
        fprintf(stderr, "usage: faultfs BACKING MOUNTPOINT EIO|ENOSPC|EDQUOT TEXT OFFSET\n");
        return 2;
    }
    static char backing_real[PATH_MAX];
    if (!realpath(argv[1], backing_real)) {
        fprintf(stderr, "faultfs: %s: %s\n", argv[1], strerror(errno));
        return 2;
    }
    backing = backing_real;
    text = argv[4];
    fault_offset = (off_t)strtoll(argv[5], NULL, 10);
    // Foreground, one thread (the calls are few and small), open to every user.
    char *fuse_argv[] = {argv[0], "-f", "-s", "-o", "allow_other,default_permissions", argv[2],
                         NULL};
    return fuse_main(6, fuse_argv, &ops, NULL);
}
