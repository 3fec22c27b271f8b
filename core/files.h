// Small file-system helpers shared by the modules that write outputs.
#pragma once

#include <stdbool.h>
#include <stddef.h>

// Creates a directory and its parents (mkdir -p: mode 0777 less the umask); die_user naming
// the path when that fails.
void make_dirs(const char *path);
// The same, returning false with the one-line reason in err instead of dying.
bool try_make_dirs(const char *path, char *err, size_t errlen);
