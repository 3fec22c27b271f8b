// Small file-system helpers shared by the modules that read inputs and write outputs.
#pragma once

#include <stdbool.h>
#include <stddef.h>

// Creates a directory and its parents (mkdir -p: mode 0777 less the umask); die_user naming
// the path when that fails.
void make_dirs(const char *path);
// The same, returning false with the one-line reason in err instead of dying.
bool try_make_dirs(const char *path, char *err, size_t errlen);

// A write the disk refused with errno err, for the one line that stops the run: the reason in
// lower case ("no space left on device", "input/output error") into buf, and what to do about
// it: "free space" for a full disk or quota, else "check the disk".
const char *write_error_why(int err, char *buf, size_t n);
const char *write_error_remedy(int err);

// What file_read_all could not do; errno says why an open or a read failed.
typedef enum {
    FILE_READ_OK,
    FILE_OPEN_FAILED,
    FILE_READ_FAILED,
    FILE_NOT_REGULAR,  // a folder, a FIFO (whose read could block forever), a device
    FILE_TOO_LARGE,    // more than max bytes
} FileReadResult;

// The whole regular file at path into *text (malloc'd, a '\0' after its *len bytes), if it
// has at most max bytes. On failure *text is NULL.
FileReadResult file_read_all(const char *path, size_t max, char **text, size_t *len);
// Why file_read_all failed, for the caller's one line: "cannot open it: ...", "is not a
// regular file", "has more than the N bytes ... may have" (what: "a config", "a tokenizer").
const char *file_read_why(FileReadResult r, size_t max, const char *what, char *buf, size_t n);
