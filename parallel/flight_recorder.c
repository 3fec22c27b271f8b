// The flight recorder (DESIGN.md "Communication"): a ring of this rank's last operations,
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
#include "parallel/comm_internal.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/errors.h"
#include "core/files.h"

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
    // SA_RESTART: a signal landing in a read or write elsewhere in titan must not fail it.
    struct sigaction sa = {.sa_handler = on_sigusr1, .sa_flags = SA_RESTART};
    SYS_CHECK(sigemptyset(&sa.sa_mask));
    SYS_CHECK(sigaction(SIGUSR1, &sa, NULL));
}

void flight_configure(int new_capacity, const char *folder) {
    CHECK(new_capacity >= 0);
    snprintf(trace_folder, sizeof trace_folder, "%s", folder ? folder : "");
    if (new_capacity == capacity) return;
    FlightEntry *resized = new_capacity ? xcalloc((size_t)new_capacity, sizeof(*resized)) : NULL;
    int64_t kept = min64(next_seq, min64(capacity, new_capacity));
    for (int64_t s = next_seq - kept; s < next_seq; s++)
        resized[s % new_capacity] = ring[s % capacity];
    if (ring != boot_ring) free(ring);
    ring = resized;
    capacity = new_capacity;
}

int64_t flight_start(const char *op, const char *group, uint64_t bytes, int peer) {
    int64_t seq = next_seq++;
    if (capacity == 0) return seq;
    ring[seq % capacity] = (FlightEntry){.seq = seq, .op = op, .group = group, .bytes = bytes,
                                         .peer = peer, .state = FLIGHT_STARTED,
                                         .start_s = flight_now()};
    return seq;
}

static FlightEntry *entry_of(int64_t seq) {
    if (capacity == 0 || seq < 0 || seq >= next_seq) return NULL;
    FlightEntry *e = &ring[seq % capacity];
    return e->seq == seq ? e : NULL;
}

void flight_complete(int64_t seq) {
    FlightEntry *e = entry_of(seq);
    if (!e) return;  // overwritten while pending: nothing left to update
    e->state = FLIGHT_COMPLETED;
    e->end_s = flight_now();
}

// One fprintf per line, so that lines of ranks dumping at once into one stream stay whole.
static void print_entry(FILE *f, const FlightEntry *e, double now) {
    char peer[32] = "", state[64];
    if (e->peer >= 0) snprintf(peer, sizeof(peer), " peer %d", e->peer);
    if (e->state == FLIGHT_COMPLETED)
        snprintf(state, sizeof(state), "completed in %.6f s", e->end_s - e->start_s);
    else
        snprintf(state, sizeof(state), "PENDING for %.3f s", now - e->start_s);
    fprintf(f, "titan: rank %d:   seq %" PRId64 " %s on group %s%s, %" PRIu64
            " bytes, started %.6f s, %s\n",
            dump_rank, e->seq, e->op, e->group, peer, e->bytes, e->start_s, state);
}

static void dump_to(FILE *f, const char *why) {
    if (capacity == 0) {
        fprintf(f, "titan: rank %d: flight recorder (%s): off (comm.trace_buf_size 0)\n",
                dump_rank, why);
        return;
    }
    double now = flight_now();
    int64_t first_kept = next_seq - min64(next_seq, capacity);
    int64_t first_shown = next_seq - min64(next_seq - first_kept, FLIGHT_DUMP_LAST);
    fprintf(f,
            "titan: rank %d: flight recorder (%s): %" PRId64 " operations, the last %" PRId64 ":\n",
            dump_rank, why, next_seq, next_seq - first_shown);
    for (int64_t s = first_shown; s < next_seq; s++) print_entry(f, &ring[s % capacity], now);
    // Older operations still pending are the ones a hang is usually about.
    bool header = false;
    for (int64_t s = first_kept; s < first_shown; s++) {
        const FlightEntry *e = &ring[s % capacity];
        if (e->state != FLIGHT_STARTED) continue;
        if (!header)
            fprintf(f, "titan: rank %d: older operations still pending:\n", dump_rank);
        header = true;
        print_entry(f, e, now);
    }
}

// A dump that cannot be written to the trace folder is still on stderr: a warning, never the
// end of a run that a SIGUSR1 only asked about.
void flight_dump(const char *why) {
    dump_to(stderr, why);
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
    dump_to(f, why);
    if (fclose(f) != 0)
        log_warn("comm.save_traces_folder: cannot write %s: %s", path, strerror(errno));
}

void flight_poll_signal(void) {
    if (!signal_pending) return;
    signal_pending = 0;
    flight_dump("SIGUSR1");
}
