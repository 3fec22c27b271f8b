#include "core/profiler.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/errors.h"
#include "core/files.h"

#define MAX_GROUPS 64   // parallel/comm.c's group table holds as many
#define MAX_THREADS 100 // threads that record: tids below the first group track's
#define MAX_LANES 100   // collectives of one group in flight at once

typedef enum { EVENT_STEP, EVENT_BLOCK, EVENT_OP, EVENT_WAIT, EVENT_COLLECTIVE } EventKind;

typedef struct {
    EventKind kind;
    char name[64];
    double ts, dur;  // microseconds; a collective still in flight has dur < 0
    int tid;         // the recording thread's (a collective's track is chosen when written)
    // args, by kind: step (index); block (label in name's first word, phase, index); wait and
    // collective (op, group, seq; a collective's bytes and peer too)
    int index;
    const char *phase, *op, *group;
    uint64_t bytes;
    int64_t seq;
    int peer;
} Event;

static ProfilerConfig config;
static atomic_bool recording;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Event *events;  // (n_events) this window's, in the order they were recorded
static size_t n_events, cap_events;
static uint32_t session;  // windows so far: the high half of a collective's id
static int window_last;   // the last step recorded
static double step_start;
static ProfilerCounter counters_start[MAX_GROUPS];
static int n_counters_start;
static _Thread_local int thread_tid = -1;
static int n_threads;

double profiler_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

bool profiler_recording(void) { return atomic_load_explicit(&recording, memory_order_relaxed); }

void profiler_configure(const ProfilerConfig *c) {
    CHECK(c->freq >= 1 && c->active >= 0 && c->active <= c->freq && c->counters);
    config = *c;
    thread_tid = 0;
    n_threads = 1;
}

// Appends an event of the calling thread, under the lock.
static Event *event_add(EventKind kind, double ts, double dur) {
    if (thread_tid < 0) {
        CHECK(n_threads < MAX_THREADS);
        thread_tid = n_threads++;
    }
    if (n_events == cap_events) {
        cap_events = cap_events ? 2 * cap_events : 4096;
        events = realloc(events, cap_events * sizeof(Event));
        CHECK(events);
    }
    events[n_events] = (Event){.kind = kind, .ts = ts, .dur = dur, .tid = thread_tid, .peer = -1};
    return &events[n_events++];
}

void profiler_op(const char *name, double start) {
    if (!profiler_recording()) return;
    double end = profiler_now();
    pthread_mutex_lock(&lock);
    Event *e = event_add(EVENT_OP, start, end - start);
    snprintf(e->name, sizeof e->name, "%s", name);
    pthread_mutex_unlock(&lock);
}

void profiler_block(const char *label, const char *phase, int index, double start) {
    if (!profiler_recording()) return;
    double end = profiler_now();
    pthread_mutex_lock(&lock);
    Event *e = event_add(EVENT_BLOCK, start, end - start);
    snprintf(e->name, sizeof e->name, "%s %s", label, phase);
    e->phase = phase;
    e->index = index;
    pthread_mutex_unlock(&lock);
}

int64_t profiler_collective_begin(const char *op, const char *group, uint64_t bytes, int64_t seq,
                                  int peer) {
    if (!profiler_recording()) return 0;
    double now = profiler_now();
    pthread_mutex_lock(&lock);
    Event *e = event_add(EVENT_COLLECTIVE, now, -1);
    snprintf(e->name, sizeof e->name, "%s", op);
    e->op = op;
    e->group = group;
    e->bytes = bytes;
    e->seq = seq;
    e->peer = peer;
    int64_t id = (int64_t)session << 32 | (int64_t)(e - events + 1);
    pthread_mutex_unlock(&lock);
    return id;
}

void profiler_collective_end(int64_t id) {
    if (id == 0 || !profiler_recording()) return;
    double now = profiler_now();
    pthread_mutex_lock(&lock);
    size_t i = (size_t)(id & 0xffffffff) - 1;
    if ((uint32_t)(id >> 32) == session && i < n_events) events[i].dur = now - events[i].ts;
    pthread_mutex_unlock(&lock);
}

void profiler_wait(const char *op, const char *group, int64_t seq, double start) {
    if (!profiler_recording()) return;
    double end = profiler_now();
    pthread_mutex_lock(&lock);
    Event *e = event_add(EVENT_WAIT, start, end - start);
    snprintf(e->name, sizeof e->name, "wait %s", op);
    e->op = op;
    e->group = group;
    e->seq = seq;
    pthread_mutex_unlock(&lock);
}

// ---- the trace file -------------------------------------------------------------------------

// Steps [freq - active + 1, freq] of each cycle of freq steps (torch.profiler's schedule with
// wait = freq - warmup - active: warm-up steps record nothing).
static bool step_profiled(int step) {
    return config.active > 0 && step >= 1 &&
           (step - 1) % config.freq >= config.freq - config.active;
}

static void dump_event(FILE *f, json_t *e, bool *first) {
    CHECK(e);
    fputs(*first ? "\n" : ",\n", f);
    *first = false;
    CHECK(json_dumpf(e, f, JSON_COMPACT) == 0 || ferror(f));  // a write error: close_output
    json_decref(e);
}

static void dump_thread_name(FILE *f, int tid, const char *name, bool *first) {
    dump_event(f, json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "name", "thread_name", "ph", "M",
                            "pid", config.rank, "tid", tid, "args", "name", name), first);
    dump_event(f, json_pack("{s:s, s:s, s:i, s:i, s:{s:i}}", "name", "thread_sort_index", "ph",
                            "M", "pid", config.rank, "tid", tid, "args", "sort_index", tid),
               first);
}

static json_t *event_args(const Event *e) {
    switch (e->kind) {
    case EVENT_STEP: return json_pack("{s:i}", "step", e->index);
    case EVENT_BLOCK: return json_pack("{s:s%, s:s, s:i}", "block", e->name,
                                       strcspn(e->name, " "), "phase", e->phase, "index",
                                       e->index);
    case EVENT_OP: return json_object();
    case EVENT_WAIT: return json_pack("{s:s, s:s, s:I}", "op", e->op, "group", e->group, "seq",
                                      (json_int_t)e->seq);
    case EVENT_COLLECTIVE: break;
    }
    json_t *args = json_pack("{s:s, s:s, s:I, s:I, s:b}", "op", e->op, "group", e->group,
                             "bytes", (json_int_t)e->bytes, "seq", (json_int_t)e->seq,
                             "complete", e->dur >= 0);
    if (args && e->peer >= 0) CHECK(json_object_set_new(args, "peer", json_integer(e->peer)) == 0);
    return args;
}

static const char *const CATEGORIES[] = {"step", "block", "op", "wait", "collective"};

static void dump_complete(FILE *f, const Event *e, int tid, double end, bool *first) {
    double dur = e->dur >= 0 ? e->dur : end - e->ts;
    dump_event(f, json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i, s:o}", "name", e->name, "cat",
                            CATEGORIES[e->kind], "ph", "X", "ts", e->ts, "dur", dur, "pid",
                            config.rank, "tid", tid, "args", event_args(e)),
               first);
}

// The collectives, each on the first lane of its group free at its start (they were recorded
// in order of start); every group's lanes named.
static void dump_collectives(FILE *f, double end, const char **groups, int *n_groups,
                             bool *first) {
    double lane_end[MAX_GROUPS][MAX_LANES];  // each lane's last collective's end
    int lanes[MAX_GROUPS] = {0};
    for (size_t i = 0; i < n_events; i++) {
        const Event *e = &events[i];
        if (e->kind != EVENT_COLLECTIVE) continue;
        int g = 0;
        while (g < *n_groups && strcmp(groups[g], e->group) != 0) g++;
        if (g == *n_groups) {
            CHECK(g < MAX_GROUPS);
            groups[(*n_groups)++] = e->group;
        }
        int lane = 0;
        while (lane < lanes[g] && lane_end[g][lane] > e->ts) lane++;
        CHECK(lane < MAX_LANES);
        if (lane == lanes[g]) lanes[g]++;
        lane_end[g][lane] = e->dur >= 0 ? e->ts + e->dur : end;
        dump_complete(f, e, 100 * (g + 1) + lane, end, first);
    }
    for (int g = 0; g < *n_groups; g++)
        for (int lane = 0; lane < lanes[g]; lane++) {
            char name[96];
            if (lane) snprintf(name, sizeof name, "%s collectives #%d", groups[g], lane);
            else snprintf(name, sizeof name, "%s collectives", groups[g]);
            dump_thread_name(f, 100 * (g + 1) + lane, name, first);
        }
}

// {"rank": r, "first_step": ..., "last_step": ..., "comm": {group: {"bytes": b, "ops": n}}}:
// the window's steps and each group's counters' growth over them (groups that did nothing
// left out).
static json_t *window_summary(int first_step) {
    ProfilerCounter now[MAX_GROUPS];
    int n = config.counters(now, MAX_GROUPS);
    CHECK(n <= MAX_GROUPS && n >= n_counters_start);
    json_t *comm = json_object();
    for (int g = 0; g < n; g++) {
        ProfilerCounter was = g < n_counters_start ? counters_start[g] : (ProfilerCounter){0};
        if (now[g].ops == was.ops) continue;
        CHECK(json_object_set_new(comm, now[g].name,
                                  json_pack("{s:I, s:I}", "bytes",
                                            (json_int_t)(now[g].bytes - was.bytes), "ops",
                                            (json_int_t)(now[g].ops - was.ops))) == 0);
    }
    return json_pack("{s:i, s:i, s:i, s:o}", "rank", config.rank, "first_step", first_step,
                     "last_step", window_last, "comm", comm);
}

static FILE *open_output(const char *folder, const char *key, int step, const char *file,
                         char *path, size_t n) {
    snprintf(path, n, "%s/iteration_%d", folder, step);
    char err[512];
    if (!try_make_dirs(path, err, sizeof err)) die_user("profiling.%s: %s", key, err);
    size_t used = strlen(path);
    snprintf(path + used, n - used, "/rank%d_%s", config.rank, file);
    FILE *f = fopen(path, "w");
    if (!f) die_user("profiling.%s: cannot write %s: %s", key, path, strerror(errno));
    return f;
}

// A write that failed (ENOSPC, EDQUOT, EIO) leaves no half file: it is removed, and the run
// stops (core/errors.h's deferred error).
static void close_output(FILE *f, const char *key, const char *path) {
    int err = ferror(f) ? (errno ? errno : EIO) : 0;
    if (fclose(f) != 0 && !err) err = errno;
    if (!err) return;
    unlink(path);
    char why[128];
    defer_user_error("profiling.%s: %s writing %s: %s or set it elsewhere", key,
                     write_error_why(err, why, sizeof why), path, write_error_remedy(err));
}

static void write_trace(void) {
    double end = profiler_now();
    pthread_mutex_lock(&lock);
    int first_step = window_last;
    for (size_t i = 0; i < n_events; i++)
        if (events[i].kind == EVENT_STEP && events[i].index < first_step)
            first_step = events[i].index;
    char path[8192];
    FILE *f = open_output(config.trace_folder, "save_traces_folder", window_last, "trace.json",
                          path, sizeof path);
    fputs("{\"traceEvents\": [", f);
    bool first = true;
    char name[64];
    snprintf(name, sizeof name, "rank %d", config.rank);
    dump_event(f, json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "name", "process_name", "ph", "M",
                            "pid", config.rank, "tid", 0, "args", "name", name), &first);
    for (int t = 0; t < n_threads; t++) {
        snprintf(name, sizeof name, t ? "thread %d" : "step", t);
        dump_thread_name(f, t, name, &first);
    }
    for (size_t i = 0; i < n_events; i++)
        if (events[i].kind != EVENT_COLLECTIVE) dump_complete(f, &events[i], events[i].tid, end,
                                                              &first);
    const char *groups[MAX_GROUPS];
    int n_groups = 0;
    dump_collectives(f, end, groups, &n_groups, &first);
    fputs("\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": ", f);
    json_t *summary = window_summary(first_step);
    CHECK(summary && (json_dumpf(summary, f, JSON_COMPACT) == 0 || ferror(f)));
    json_decref(summary);
    fputs("}\n", f);
    close_output(f, "save_traces_folder", path);
    n_events = 0;
    atomic_store(&recording, false);
    pthread_mutex_unlock(&lock);
    log_info("profiling: steps %d-%d traced to %s", first_step, window_last, path);
}

// ---- the step loop --------------------------------------------------------------------------

static json_t *bytes_json(ArenaBytes b) {
    json_t *by = json_object();
    for (int t = 0; t < DTYPE_COUNT; t++)
        if (b.by[t])
            CHECK(json_object_set_new(by, dtype_name(t), json_integer((json_int_t)b.by[t])) == 0);
    return json_pack("{s:I, s:o}", "total", (json_int_t)b.total, "by_dtype", by);
}

static void write_snapshot(int step) {
    json_t *arenas = json_array();
    size_t committed = 0, peak = 0;
    for (int i = 0; i < config.n_arenas; i++) {
        const Arena *a = config.arenas[i];
        committed += a->size;
        peak += a->high.total;
        CHECK(json_array_append_new(arenas, json_pack("{s:s, s:I, s:o, s:o}", "name", a->name,
                                                      "committed", (json_int_t)a->size, "used",
                                                      bytes_json(a->used), "peak",
                                                      bytes_json(a->high))) == 0);
    }
    json_t *root = json_pack("{s:i, s:i, s:I, s:I, s:o}", "step", step, "rank", config.rank,
                             "committed", (json_int_t)committed, "peak", (json_int_t)peak,
                             "arenas", arenas);
    CHECK(root);
    char path[8192];
    FILE *f = open_output(config.snapshot_folder, "save_memory_snapshot_folder", step,
                          "memory_snapshot.json", path, sizeof path);
    CHECK(json_dumpf(root, f, JSON_INDENT(2)) == 0 || ferror(f));
    fputs("\n", f);
    close_output(f, "save_memory_snapshot_folder", path);
    json_decref(root);
}

void profiler_step_begin(int step) {
    if (config.snapshot_folder && step % config.freq == 0)
        for (int i = 0; i < config.n_arenas; i++) arena_high_reset(config.arenas[i]);
    if (!step_profiled(step)) return;
    if (!profiler_recording()) {
        pthread_mutex_lock(&lock);
        session++;
        n_events = 0;
        n_counters_start = config.counters(counters_start, MAX_GROUPS);
        CHECK(n_counters_start <= MAX_GROUPS);
        atomic_store(&recording, true);
        pthread_mutex_unlock(&lock);
    }
    step_start = profiler_now();
}

void profiler_step_end(int step) {
    if (profiler_recording()) {
        pthread_mutex_lock(&lock);
        Event *e = event_add(EVENT_STEP, step_start, profiler_now() - step_start);
        snprintf(e->name, sizeof e->name, "ProfilerStep#%d", step);
        e->index = step;
        window_last = step;
        pthread_mutex_unlock(&lock);
        if (step % config.freq == 0) write_trace();
    }
    if (config.snapshot_folder && step % config.freq == 0) write_snapshot(step);
}

void profiler_finish(void) {
    if (profiler_recording()) write_trace();
}
