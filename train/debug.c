// comm.enable_debug_server: every rank's debug server (core/debug_server.h), rank r on port
// comm.debug_server_port + r of comm.debug_server_host, started before setup so that a hang
// there can be inspected too.
#include <inttypes.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/debug_server.h"
#include "train/train.h"

// The address a browser on the rank's machine reaches its server at: the bound address, or
// the host name when every interface is bound.
static void server_url(char *url, size_t n, const char *address, const char *host, int port) {
    bool any = !strcmp(address, "0.0.0.0") || !strcmp(address, "::");
    const char *name = any ? host : address;
    bool ipv6 = strchr(name, ':') != NULL;
    snprintf(url, n, ipv6 ? "http://[%s]:%d" : "http://%s:%d", name, port);
}

void trainer_start_debug_server(const Config *c) {
    const CommSection *cs = &c->comm;
    if (!cs->enable_debug_server) return;
    CommGroup *world = comm_world();
    int rank = comm_rank(world), size = comm_size(world);
    if (cs->debug_server_port + size - 1 > 65535)  // the same on every rank: one line
        die_user("comm.debug_server_port: %" PRId64 " + %d ranks runs past port 65535",
                 cs->debug_server_port, size);
    int port = (int)cs->debug_server_port + rank;
    DebugServerRank me = {.pid = (int)getpid()};
    if (gethostname(me.host, sizeof me.host) != 0) snprintf(me.host, sizeof me.host, "?");
    me.host[sizeof me.host - 1] = 0;  // gethostname may leave a cut name unterminated
    server_url(me.url, sizeof me.url, cs->debug_server_host, me.host, port);
    DebugServerRank *ranks = xcalloc((size_t)size, sizeof *ranks);  // lives as long as the server
    comm_all_gather_host(world, &me, ranks, sizeof me);
    char *yaml = config_to_yaml(c), err[512];
    // A port taken on one machine fails that rank alone: its line must print there.
    bool collective = die_user_is_collective();
    die_user_collective(false);
    if (!debug_server_start(&(DebugServerConfig){.address = cs->debug_server_host, .port = port,
                                                 .rank = rank, .ranks = ranks, .n_ranks = size,
                                                 .config_yaml = yaml,
                                                 .write_trace = comm_write_trace,
                                                 .write_trace_summary = comm_write_trace_summary},
                            err, sizeof err))
        die_user("comm.debug_server_port: rank %d: %s", rank, err);
    die_user_collective(collective);
    free(yaml);
    debug_server_phase("setup");
    bool remote = !debug_server_address_is_loopback(cs->debug_server_host);
    log_info("debug server: rank 0 at %s/ (rank r at port %d + r)%s", ranks[0].url,
             (int)cs->debug_server_port,
             remote ? "; other hosts can read it, unauthenticated (comm.debug_server_allow_remote)"
                    : "");
}
