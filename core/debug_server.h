// The debug server (comm.enable_debug_server; PyTorch's distributed debug server, in C): an HTTP
// server on every rank, in threads of its own (libmicrohttpd's thread pool), that answers while
// the rank trains, waits on a peer or hangs:
//   /                 this rank's pages; on rank 0 also every rank's host, pid and pages
//   /status           rank, pid, host, the step in progress and its phase, the newest
//                     collective and the oldest still pending
//   /flight_recorder  the flight recorder, as a SIGUSR1 dump prints it
//   /stacks           every thread's stack (core/thread_stacks.h); concurrent askers share one
//                     capture
//   /config           the resolved config (YAML, as --print-config prints it)
//   /metrics          the last logged step's figures, in Prometheus' text format
// Pages are formatted in the server's threads. The training thread only publishes: its step and
// phase through atomics, its metrics through a copy under a mutex (never held longer than a
// copy), and the flight recorder takes its own lock for one entry (parallel/comm.h).
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "core/metrics.h"

// A rank's server, as rank 0's index lists it.
typedef struct {
    char url[128];   // "http://127.0.0.1:26000"
    char host[64];   // the host name of its machine
    int pid;
} DebugServerRank;

typedef struct {
    const char *address;      // the address to listen on: numeric, IPv4 or IPv6
    int port;                 // this rank's port
    int rank;
    const DebugServerRank *ranks;  // (n_ranks) every rank's server; read by rank 0's index
    int n_ranks;
    const char *config_yaml;  // the resolved config (copied)
    // The flight recorder's dump and its three summary lines (parallel/comm.h's
    // comm_write_trace and comm_write_trace_summary): core/ reaches comm only through these.
    void (*write_trace)(FILE *f);
    void (*write_trace_summary)(FILE *f);
} DebugServerConfig;

// Listens and starts the server's thread; false with the reason in err when the port cannot
// be bound (in use, privileged, an address of no interface here).
bool debug_server_start(const DebugServerConfig *c, char *err, size_t errlen);
// 127.0.0.0/8, ::1 or an IPv4-mapped 127.x.y.z: an address no other host can connect to.
// Anything else needs comm.debug_server_allow_remote (core/config_check.c).
bool debug_server_address_is_loopback(const char *address);
// Stops the thread and closes the port (nothing to do when none runs).
void debug_server_stop(void);

// What the training loop publishes, whether or not a server runs (an atomic store each).
void debug_server_step(int step);  // the step in progress
// What the step is doing, a string that lives as long as the process: "setup",
// "forward_backward", "optimizer", "validation", "checkpoint", "done".
void debug_server_phase(const char *phase);
// A logged step's figures (metrics_write's): /metrics serves the last.
void debug_server_metrics(const StepMetrics *m);
