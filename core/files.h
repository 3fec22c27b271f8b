// Small file-system helpers shared by the modules that write outputs.
#pragma once

// Creates a directory and its parents (mkdir -p); die_user naming the path when that fails.
void make_dirs(const char *path);
