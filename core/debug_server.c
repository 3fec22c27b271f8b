#include "core/debug_server.h"

#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/errors.h"
#include "core/thread_stacks.h"

// ---- what training publishes --------------------------------------------------------------

static atomic_int current_step;
static _Atomic(const char *) current_phase = "setup";
static atomic_llong phase_since_ns;  // CLOCK_MONOTONIC

static pthread_mutex_t metrics_lock = PTHREAD_MUTEX_INITIALIZER;
static StepMetrics last_metrics;  // valid once have_metrics
static bool have_metrics;

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

void debug_server_step(int step) {
    atomic_store_explicit(&current_step, step, memory_order_relaxed);
}

void debug_server_phase(const char *phase) {
    atomic_store_explicit(&phase_since_ns, now_ns(), memory_order_relaxed);
    atomic_store_explicit(&current_phase, phase, memory_order_relaxed);
}

void debug_server_metrics(const StepMetrics *m) {
    pthread_mutex_lock(&metrics_lock);
    last_metrics = *m;
    have_metrics = true;
    pthread_mutex_unlock(&metrics_lock);
}

// ---- pages ------------------------------------------------------------------------------------

static DebugServerConfig server;  // the config, with config_yaml owned
static struct MHD_Daemon *daemon_handle;

typedef struct {
    const char *path, *type, *about;
    void (*write)(FILE *f);
} Page;

static void write_index(FILE *f);
static void write_status(FILE *f);
static void write_trace(FILE *f) { server.write_trace(f); }
static void write_config(FILE *f) { fputs(server.config_yaml, f); }
static void write_metrics(FILE *f);

static const Page PAGES[] = {
    {"/", "text/html; charset=utf-8", "this page", write_index},
    {"/status", "text/plain; charset=utf-8", "step, phase, the last and the oldest pending "
     "collective", write_status},
    {"/flight_recorder", "text/plain; charset=utf-8", "the flight recorder", write_trace},
    {"/stacks", "text/plain; charset=utf-8", "every thread's stack", thread_stacks_write},
    {"/config", "text/plain; charset=utf-8", "the resolved config (YAML)", write_config},
    {"/metrics", "text/plain; version=0.0.4; charset=utf-8", "Prometheus metrics",
     write_metrics},
};
#define N_PAGES (sizeof PAGES / sizeof PAGES[0])

static void write_links(FILE *f, const char *url) {
    for (size_t i = 1; i < N_PAGES; i++)
        fprintf(f, " <a href=\"%s%s\">%s</a>", url, PAGES[i].path, PAGES[i].path + 1);
}

static void write_index(FILE *f) {
    const DebugServerRank *me = &server.ranks[server.rank];
    fprintf(f, "<!doctype html>\n<html><head><title>titan rank %d</title></head><body>\n"
            "<h1>titan rank %d</h1>\n<p>%s, pid %d</p>\n<ul>\n",
            server.rank, server.rank, me->host, me->pid);
    for (size_t i = 1; i < N_PAGES; i++)
        fprintf(f, "<li><a href=\"%s\">%s</a>: %s</li>\n", PAGES[i].path, PAGES[i].path + 1,
                PAGES[i].about);
    fputs("</ul>\n", f);
    if (server.rank == 0) {
        fputs("<h2>every rank</h2>\n<table>\n<tr><th>rank</th><th>server</th><th>host</th>"
              "<th>pid</th><th>pages</th></tr>\n", f);
        for (int r = 0; r < server.n_ranks; r++) {
            const DebugServerRank *x = &server.ranks[r];
            fprintf(f, "<tr><td>%d</td><td><a href=\"%s/\">%s</a></td><td>%s</td><td>%d</td><td>",
                    r, x->url, x->url, x->host, x->pid);
            write_links(f, x->url);
            fputs("</td></tr>\n", f);
        }
        fputs("</table>\n", f);
    }
    fputs("</body></html>\n", f);
}

static void write_status(FILE *f) {
    const DebugServerRank *me = &server.ranks[server.rank];
    double in_phase = 1e-9 * (double)(now_ns() - atomic_load(&phase_since_ns));
    fprintf(f, "rank: %d\npid: %d\nhost: %s\nstep: %d\nphase: %s\nphase_seconds: %.3f\n",
            server.rank, me->pid, me->host, atomic_load(&current_step),
            atomic_load(&current_phase), in_phase);
    server.write_trace_summary(f);
}

// One gauge: its HELP and TYPE lines, then its sample labelled with the rank.
static void gauge(FILE *f, const char *name, const char *help, double value) {
    fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n%s{rank=\"%d\"} %.17g\n", name, help, name, name,
            server.rank, value);
}

static void write_metrics(FILE *f) {
    pthread_mutex_lock(&metrics_lock);
    StepMetrics m = last_metrics;
    bool have = have_metrics;
    pthread_mutex_unlock(&metrics_lock);
    gauge(f, "titan_step", "The training step in progress.", atomic_load(&current_step));
    if (!have) return;  // no step logged yet
    gauge(f, "titan_logged_step", "The last logged step, which the figures below are of.",
          m.step);
    gauge(f, "titan_loss", "The loss of the last logged step.", m.loss);
    gauge(f, "titan_grad_norm", "The gradient norm before clipping.", m.grad_norm);
    gauge(f, "titan_learning_rate", "The learning rate.", m.lr);
    gauge(f, "titan_tokens_per_second", "Tokens per second per device since the last log.",
          m.tokens_per_s);
    gauge(f, "titan_tflops", "Achieved model TFLOP/s per device.", m.tflops);
    if (!isnan(m.mfu)) gauge(f, "titan_mfu_percent", "Model FLOPs utilization.", m.mfu);
    gauge(f, "titan_peak_memory_bytes", "The process's peak resident memory.",
          m.peak_memory_gib * (1 << 30));
    if (m.expert_load_max > 0) {
        gauge(f, "titan_expert_load_max", "The busiest expert's load over its layer's mean.",
              m.expert_load_max);
        gauge(f, "titan_expert_load_mean", "That ratio averaged over the MoE layers.",
              m.expert_load_mean);
    }
    if (!isnan(m.aux_loss)) gauge(f, "titan_aux_loss", "The MoE balance loss.", m.aux_loss);
}

// ---- HTTP -------------------------------------------------------------------------------------

static enum MHD_Result respond(struct MHD_Connection *c, unsigned status, const char *type,
                               char *body, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **request) {
    (void)cls, (void)version, (void)upload_data, (void)upload_data_size, (void)request;
    const Page *page = NULL;
    for (size_t i = 0; i < N_PAGES; i++)
        if (strcmp(url, PAGES[i].path) == 0) page = &PAGES[i];
    char *body = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&body, &len);
    if (!f) return MHD_NO;
    unsigned status = MHD_HTTP_OK;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        status = MHD_HTTP_METHOD_NOT_ALLOWED;
        fprintf(f, "%s: only GET\n", method);
    } else if (!page) {
        status = MHD_HTTP_NOT_FOUND;
        fprintf(f, "%s: no such page; / lists them\n", url);
    } else {
        page->write(f);
    }
    if (fclose(f) != 0) return MHD_NO;
    return respond(c, status, page && status == MHD_HTTP_OK ? page->type : "text/plain", body,
                   len);
}

// A socket listening on address:port; -1 with the reason in err.
static int listen_on(const char *address, int port, bool *ipv6, char *err, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(address, service, &hints, &ai);
    if (rc != 0) {
        error_set(err, errlen, "cannot use address %s: %s", address, gai_strerror(rc));
        return -1;
    }
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol), one = 1;
    // SO_REUSEADDR: a run restarted at once can take the port its predecessor's connections
    // still hold in TIME_WAIT; a port another process listens on stays refused.
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 16) != 0) {
        error_set(err, errlen, "cannot listen on %s port %d: %s", address, port, strerror(errno));
        if (fd >= 0) close(fd);
        fd = -1;
    }
    *ipv6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    return fd;
}

bool debug_server_start(const DebugServerConfig *c, char *err, size_t errlen) {
    CHECK(!daemon_handle && c->rank < c->n_ranks);
    bool ipv6 = false;
    int fd = listen_on(c->address, c->port, &ipv6, err, errlen);
    if (fd < 0) return false;
    server = *c;
    server.config_yaml = strdup(c->config_yaml);
    thread_stacks_init();
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ipv6) flags |= MHD_USE_IPv6;
    daemon_handle = MHD_start_daemon(flags, 0, NULL, NULL, on_request, NULL,
                                     MHD_OPTION_LISTEN_SOCKET, fd,
                                     MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    CHECK(daemon_handle != NULL);
    return true;
}

void debug_server_stop(void) {
    if (!daemon_handle) return;
    MHD_stop_daemon(daemon_handle);  // closes the listening socket too
    daemon_handle = NULL;
    free((char *)server.config_yaml);
}
