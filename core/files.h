// Small file-system helpers shared by the modules that read inputs and write outputs.
#pragma once

#include <stdbool.h>
#include <stddef.h>

// Creates a directory and its parents (mkdir -p: mode 0777 less the umask); die_user naming
// the path when that fails.
void make_dirs(const char *path);
// The same, returning false with the one-line reason in err instead of dying.
bool try_make_dirs(const char *path, char *err, size_t errlen);

// What file_read_all could not do; errno then says why. Each caller words its own message.
typedef enum { FILE_READ_OK, FILE_OPEN_FAILED, FILE_READ_FAILED } FileReadResult;

// The whole file at path into *text (malloc'd, a '\0' after its *len bytes), reading at most
// max bytes of it (SIZE_MAX: no limit): a caller that refuses files over a size passes one
// byte more and sees a larger file as one. On failure *text is NULL.
FileReadResult file_read_all(const char *path, size_t max, char **text, size_t *len);
