// The flight recorder (docs/design.md "Communication"): a ring of this rank's last operations,
// dumped to stderr on a timeout or SIGUSR1 so that a hang names the rank, the collective and
// the group it is stuck in, and the sequence numbers line up the ranks against each other.
// Each dump also goes to <comm.save_traces_folder>/rank_<r>.txt (appended: one file per rank,
// as torchtitan's per-rank trace files), which outlives a scheduler's truncated stderr.
//
// Signal safety: the SIGUSR1 handler only sets a sig_atomic_t flag. The dump (stdio and
// formatting, neither async-signal-safe) runs in normal context at the next comm call or in
// comm_wait's polling loop, which is where a rank hung in communication sits. A rank stuck
// outside communication (in compute) dumps when it next communicates: the price of not
// formatting inside the handler. `kill -USR1` on mpirun forwards the signal to every rank.
//
// Threads: operations are recorded by the thread that communicates; the debug server's thread
// (core/debug_server.h) reads the ring at any time. A mutex orders them, held by the recording
// side for one entry's store and by a reader for a copy of the entries it shows, never while
// formatting or writing, so a reader delays training by a copy at most.
#include "parallel/comm_internal.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/errors.h"
#include "core/files.h"
#include "core/signal_stack.h"

typedef enum { FLIGHT_STARTED, FLIGHT_COMPLETED } FlightState;

typedef struct {
    int64_t seq;
    const char *op;      // a string literal
    const char *group;   // the group's name, which lives as long as the process
    uint64_t bytes;      // as counted by comm_bytes
    int peer;            // send/recv peer or broadcast root, -1 otherwise
    FlightState state;
    double start_s, end_s;  // seconds since the recorder started
} FlightEntry;

#define FLIGHT_BOOT_CAPACITY 64  // until comm_configure sizes the ring from the config
#define FLIGHT_DUMP_LAST 32

static FlightEntry boot_ring[FLIGHT_BOOT_CAPACITY];
static FlightEntry *ring = boot_ring;  // entry seq lives at ring[seq % capacity]
static int64_t capacity = FLIGHT_BOOT_CAPACITY;
static int64_t next_seq;
static int dump_rank;
static struct timespec epoch;
static volatile sig_atomic_t signal_pending;
static char trace_folder[4096];  // "" : stderr only
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;  // ring, capacity, next_seq

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

double flight_now(void) {
    struct timespec t;
    SYS_CHECK(clock_gettime(CLOCK_MONOTONIC, &t));
    return (double)(t.tv_sec - epoch.tv_sec) + 1e-9 * (double)(t.tv_nsec - epoch.tv_nsec);
}

static void on_sigusr1(int sig) {
    (void)sig;
    signal_pending = 1;
}

void flight_init(int rank) {
    dump_rank = rank;
    SYS_CHECK(clock_gettime(CLOCK_MONOTONIC, &epoch));
    // SA_RESTART: a signal landing in a read or write elsewhere in titan must not fail it;
    // SA_ONSTACK: not on the interrupted stack (core/signal_stack.h).
    signal_stack_ensure();
    struct sigaction sa = {.sa_handler = on_sigusr1, .sa_flags = SA_RESTART | SA_ONSTACK};
    SYS_CHECK(sigemptyset(&sa.sa_mask));
    SYS_CHECK(sigaction(SIGUSR1, &sa, NULL));
}

void flight_configure(int new_capacity, const char *folder) {
    CHECK(new_capacity >= 0);
    snprintf(trace_folder, sizeof trace_folder, "%s", folder ? folder : "");
    if (new_capacity == capacity) return;
    FlightEntry *resized = new_capacity ? xcalloc((size_t)new_capacity, sizeof(*resized)) : NULL;
    pthread_mutex_lock(&ring_lock);
    int64_t kept = min64(next_seq, min64(capacity, new_capacity));
    for (int64_t s = next_seq - kept; s < next_seq; s++)
        resized[s % new_capacity] = ring[s % capacity];
    if (ring != boot_ring) free(ring);
    ring = resized;
    capacity = new_capacity;
    pthread_mutex_unlock(&ring_lock);
}

int64_t flight_start(const char *op, const char *group, uint64_t bytes, int peer) {
    FlightEntry e = {.op = op, .group = group, .bytes = bytes, .peer = peer,
                     .state = FLIGHT_STARTED, .start_s = flight_now()};
    pthread_mutex_lock(&ring_lock);
    e.seq = next_seq++;
    if (capacity > 0) ring[e.seq % capacity] = e;
    pthread_mutex_unlock(&ring_lock);
    return e.seq;
}

static FlightEntry *entry_of(int64_t seq) {
    if (capacity == 0 || seq < 0 || seq >= next_seq) return NULL;
    FlightEntry *e = &ring[seq % capacity];
    return e->seq == seq ? e : NULL;
}

void flight_complete(int64_t seq) {
    double end_s = flight_now();
    pthread_mutex_lock(&ring_lock);
    FlightEntry *e = entry_of(seq);
    if (e) {  // else overwritten while pending: nothing left to update
        e->state = FLIGHT_COMPLETED;
        e->end_s = end_s;
    }
    pthread_mutex_unlock(&ring_lock);
}

// "seq 12 all_reduce on group world, 16 bytes, started 1.2 s, completed in 0.001 s".
static void entry_text(char *buf, size_t n, const FlightEntry *e, double now) {
    char peer[32] = "", state[64];
    if (e->peer >= 0) snprintf(peer, sizeof(peer), " peer %d", e->peer);
    if (e->state == FLIGHT_COMPLETED)
        snprintf(state, sizeof(state), "completed in %.6f s", e->end_s - e->start_s);
    else
        snprintf(state, sizeof(state), "PENDING for %.3f s", now - e->start_s);
    snprintf(buf, n, "seq %" PRId64 " %s on group %s%s, %" PRIu64 " bytes, started %.6f s, %s",
             e->seq, e->op, e->group, peer, e->bytes, e->start_s, state);
}

// One fprintf per line, so that lines of ranks dumping at once into one stream stay whole.
static void print_entry(FILE *f, const FlightEntry *e, double now) {
    char text[256];
    entry_text(text, sizeof text, e, now);
    fprintf(f, "titan: rank %d:   %s\n", dump_rank, text);
}

// What a dump shows, copied out of the ring under its lock: the last FLIGHT_DUMP_LAST entries,
// then the older ones still pending, which a hang is usually about.
typedef struct {
    int64_t total;          // operations recorded so far
    int64_t capacity;       // the ring's, when copied (0: the recorder is off)
    FlightEntry *entries;   // (n) the shown entries, then the older pending ones; malloc'd
    int64_t n, shown;
} FlightCopy;

static FlightCopy ring_copy(void) {
    pthread_mutex_lock(&ring_lock);
    FlightCopy c = {.total = next_seq, .capacity = capacity};
    int64_t first_kept = next_seq - min64(next_seq, capacity);
    int64_t first_shown = next_seq - min64(next_seq - first_kept, FLIGHT_DUMP_LAST);
    c.entries = xmalloc(sizeof(FlightEntry) * (size_t)(next_seq - first_kept));
    for (int64_t s = first_shown; s < next_seq; s++) c.entries[c.n++] = ring[s % capacity];
    c.shown = c.n;
    for (int64_t s = first_kept; s < first_shown; s++)
        if (ring[s % capacity].state == FLIGHT_STARTED) c.entries[c.n++] = ring[s % capacity];
    pthread_mutex_unlock(&ring_lock);
    return c;
}

void flight_write(FILE *f, const char *why) {
    FlightCopy c = ring_copy();
    if (c.capacity == 0) {
        fprintf(f, "titan: rank %d: flight recorder (%s): off (comm.trace_buf_size 0)\n",
                dump_rank, why);
        free(c.entries);
        return;
    }
    double now = flight_now();
    fprintf(f,
            "titan: rank %d: flight recorder (%s): %" PRId64 " operations, the last %" PRId64 ":\n",
            dump_rank, why, c.total, c.shown);
    for (int64_t i = 0; i < c.n; i++) {
        if (i == c.shown)
            fprintf(f, "titan: rank %d: older operations still pending:\n", dump_rank);
        print_entry(f, &c.entries[i], now);
    }
    free(c.entries);
}

void flight_write_summary(FILE *f) {
    FlightCopy c = ring_copy();
    double now = flight_now();
    const FlightEntry *pending = NULL;  // the oldest still pending
    for (int64_t i = 0; i < c.n; i++)
        if (c.entries[i].state == FLIGHT_STARTED && (!pending || c.entries[i].seq < pending->seq))
            pending = &c.entries[i];
    char last[256] = "none", oldest[256] = "none";
    if (c.shown > 0) entry_text(last, sizeof last, &c.entries[c.shown - 1], now);
    if (pending) entry_text(oldest, sizeof oldest, pending, now);
    fprintf(f, "operations: %" PRId64 "\nlast operation: %s\noldest pending: %s\n", c.total, last,
            oldest);
    free(c.entries);
}

// A dump that cannot be written to the trace folder is still on stderr: a warning, never the
// end of a run that a SIGUSR1 only asked about.
void flight_dump(const char *why) {
    flight_write(stderr, why);
    if (!trace_folder[0]) return;
    char path[4096 + 32], err[4096 + 256];
    snprintf(path, sizeof path, "%s/rank_%d.txt", trace_folder, dump_rank);
    if (!try_make_dirs(trace_folder, err, sizeof err)) {
        log_warn("comm.save_traces_folder: %s", err);
        return;
    }
    FILE *f = fopen(path, "a");
    if (!f) {
        log_warn("comm.save_traces_folder: cannot write %s: %s", path, strerror(errno));
        return;
    }
    flight_write(f, why);
    if (fclose(f) != 0)
        log_warn("comm.save_traces_folder: cannot write %s: %s", path, strerror(errno));
}

void flight_poll_signal(void) {
    if (!signal_pending) return;
    signal_pending = 0;
    flight_dump("SIGUSR1");
}
