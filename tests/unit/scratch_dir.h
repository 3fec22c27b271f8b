// A scratch directory for one cmocka test group: created by the group setup, removed with
// everything in it by the group teardown. Header-only, shared by the unit tests that write
// files.
#pragma once

#include <stdio.h>
#include <stdlib.h>

static char dir[256];

static int dir_setup(void **state) {
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/titan_test_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int dir_teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd);
}
