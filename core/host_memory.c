#include "core/host_memory.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

// One number from a file (a cgroup's limit or usage); false when absent or "max" (no limit).
static bool read_bytes(const char *path, size_t *out) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    unsigned long long v;
    bool ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    *out = (size_t)v;
    return ok;
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

// The room (limit - usage) the memory cgroup at `dir` and each of its ancestors leave, the
// smallest of them: any of those limits gets the process killed. limit/usage name the files
// of the cgroup version (v2: memory.max, memory.current; v1: memory.limit_in_bytes,
// memory.usage_in_bytes). A v1 "no limit" is a huge number, which the min ignores.
static size_t cgroup_room(char *dir, size_t root_len, const char *limit, const char *usage) {
    size_t room = SIZE_MAX;
    for (;;) {
        char path[4096 + 32];
        size_t max, used;
        snprintf(path, sizeof path, "%s/%s", dir, limit);
        bool limited = read_bytes(path, &max);
        snprintf(path, sizeof path, "%s/%s", dir, usage);
        if (limited && read_bytes(path, &used)) room = min_size(room, max > used ? max - used : 0);
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < root_len) return room;
        *slash = '\0';
    }
}

// /proc/self/cgroup names the process's cgroup: "0::/path" (v2, under /sys/fs/cgroup) or
// "N:...memory...:/path" (v1, under /sys/fs/cgroup/memory).
static size_t cgroups_room(void) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return SIZE_MAX;
    size_t room = SIZE_MAX;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *controllers = strchr(line, ':'), *rel = controllers ? strchr(controllers + 1, ':') : NULL;
        if (!rel) continue;
        *rel++ = '\0';
        bool v2 = strcmp(controllers, ":") == 0, v1 = strstr(controllers, "memory") != NULL;
        if (!v1 && !v2) continue;
        const char *root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
        char dir[4096];
        snprintf(dir, sizeof dir, "%s%s", root, strcmp(rel, "/") == 0 ? "" : rel);
        room = min_size(room, v2 ? cgroup_room(dir, strlen(root), "memory.max", "memory.current")
                                 : cgroup_room(dir, strlen(root), "memory.limit_in_bytes",
                                               "memory.usage_in_bytes"));
    }
    fclose(f);
    return room;
}

// The kernel's estimate of what can be allocated without swapping, in kB.
static size_t meminfo_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return SIZE_MAX;
    char line[256];
    unsigned long long kb;
    size_t available = SIZE_MAX;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) available = (size_t)kb * 1024;
    fclose(f);
    return available;
}

size_t host_memory_free(void) { return min_size(meminfo_available(), cgroups_room()); }
