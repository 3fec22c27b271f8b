#include "core/debug_server.h"

#include <arpa/inet.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/errors.h"
#include "core/thread_stacks.h"

// Bounds on what clients can take (issue 30): a request that blocks (a /stacks capture) holds
// one of the pool's threads, so the rest still answer; the connection limits keep a client or a
// crowd from exhausting the process's descriptors; past MAX_CONNECTIONS new connections wait in
// the kernel's listen queue (libmicrohttpd stops accepting) rather than being refused, and past
// a client's share they are closed at once.
#define SERVER_THREADS 4
#define MAX_CONNECTIONS 64
#define MAX_CONNECTIONS_PER_CLIENT 8
#define LISTEN_BACKLOG 256
// A connection must send its request and be answered within this of opening (the server
// closes each connection after its answer); libmicrohttpd's own timeout is an idle one, which
// a client sending a byte now and then (slow-loris) never trips.
#define REQUEST_SECONDS 10
// Concurrent /stacks askers share one capture; one that started less than this ago is served
// again. Below a person's reload interval, so a person always sees a new one; a storm of
// askers costs training at most 1 s / STACKS_REUSE_NS captures a second (each interrupts every
// thread once).
#define STACKS_REUSE_NS 100000000LL

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
static void write_stacks(FILE *f);

static const Page PAGES[] = {
    {"/", "text/html; charset=utf-8", "this page", write_index},
    {"/status", "text/plain; charset=utf-8", "step, phase, the last and the oldest pending "
     "collective", write_status},
    {"/flight_recorder", "text/plain; charset=utf-8", "the flight recorder", write_trace},
    {"/stacks", "text/plain; charset=utf-8", "every thread's stack", write_stacks},
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

// ---- libmicrohttpd's messages -------------------------------------------------------------------
// A bad request makes libmicrohttpd say so; on titan's stderr a client could flood the job's
// log. titan's log has no debug level, so they stay here, counted, the last shown in /status.

static pthread_mutex_t server_log_lock = PTHREAD_MUTEX_INITIALIZER;
static long long server_log_count;
static char server_log_last[256];  // escaped: one line

static void on_server_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[256];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = 0;
    pthread_mutex_lock(&server_log_lock);
    server_log_count++;
    error_escape(server_log_last, sizeof server_log_last, line);
    pthread_mutex_unlock(&server_log_lock);
}

static void write_server_log(FILE *f) {
    pthread_mutex_lock(&server_log_lock);
    fprintf(f, "server_messages: %lld\n", server_log_count);
    if (server_log_count) fprintf(f, "server_last_message: %s\n", server_log_last);
    pthread_mutex_unlock(&server_log_lock);
}

// ---- /stacks: one capture for concurrent askers ---------------------------------------------
// The first asker captures (thread_stacks_write takes one caller at a time); askers arriving
// meanwhile wait for that capture (generation counter) instead of queueing for captures of
// their own; a capture that started less than STACKS_REUSE_NS ago is served as it is.

static pthread_mutex_t stacks_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t stacks_done = PTHREAD_COND_INITIALIZER;
static char *stacks_text;  // the newest capture; NULL before the first
static size_t stacks_len;
static long long stacks_started_ns;  // of stacks_text
static unsigned long stacks_generation;  // captures finished
static bool stacks_capturing;

static void stacks_capture(void) {  // called and returns with stacks_lock held
    stacks_capturing = true;
    long long started = now_ns();
    pthread_mutex_unlock(&stacks_lock);
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    CHECK(m != NULL);
    thread_stacks_write(m);
    CHECK(fclose(m) == 0);
    pthread_mutex_lock(&stacks_lock);
    free(stacks_text);
    stacks_text = text, stacks_len = len, stacks_started_ns = started;
    stacks_generation++;
    stacks_capturing = false;
    pthread_cond_broadcast(&stacks_done);
}

static void write_stacks(FILE *f) {
    pthread_mutex_lock(&stacks_lock);
    if (stacks_capturing) {
        unsigned long generation = stacks_generation;
        while (stacks_generation == generation) pthread_cond_wait(&stacks_done, &stacks_lock);
    } else if (!stacks_text || now_ns() - stacks_started_ns >= STACKS_REUSE_NS) {
        stacks_capture();
    }
    fprintf(f, "capture %lu, started %.3f s ago\n\n", stacks_generation,
            1e-9 * (double)(now_ns() - stacks_started_ns));
    fwrite(stacks_text, 1, stacks_len, f);
    pthread_mutex_unlock(&stacks_lock);
}

static void write_status(FILE *f) {
    const DebugServerRank *me = &server.ranks[server.rank];
    double in_phase = 1e-9 * (double)(now_ns() - atomic_load(&phase_since_ns));
    fprintf(f, "rank: %d\npid: %d\nhost: %s\nstep: %d\nphase: %s\nphase_seconds: %.3f\n",
            server.rank, me->pid, me->host, atomic_load(&current_step),
            atomic_load(&current_phase), in_phase);
    server.write_trace_summary(f);
    write_server_log(f);
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

// ---- connection deadlines -------------------------------------------------------------------
// Every open connection, with the time by which it must be answered. A thread of ours shuts
// down the socket of one past it; libmicrohttpd then sees the end of the stream and closes the
// connection itself. It reports the close (NOTIFY_CLOSED, which takes the lock the cut takes)
// before it closes the descriptor, so a descriptor reused since is never cut.

typedef struct {
    bool open, cut;
    int fd;
    long long deadline_ns;
} Deadline;

static pthread_mutex_t deadlines_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t deadlines_wake;  // CLOCK_MONOTONIC: stop, or the next look
static Deadline deadlines[MAX_CONNECTIONS];
static bool deadlines_stop;
static pthread_t deadlines_thread;

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    (void)cls;
    pthread_mutex_lock(&deadlines_lock);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *info =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        for (int i = 0; i < MAX_CONNECTIONS && info; i++) {
            if (deadlines[i].open) continue;
            deadlines[i] = (Deadline){.open = true, .fd = info->connect_fd,
                                      .deadline_ns = now_ns() + REQUEST_SECONDS * 1000000000LL};
            *socket_context = &deadlines[i];
            break;
        }
    } else if (*socket_context) {
        ((Deadline *)*socket_context)->open = false;
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&deadlines_lock);
}

static void *deadlines_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&deadlines_lock);
    while (!deadlines_stop) {
        long long now = now_ns();
        for (int i = 0; i < MAX_CONNECTIONS; i++) {
            Deadline *d = &deadlines[i];
            if (!d->open || d->cut || now < d->deadline_ns) continue;
            shutdown(d->fd, SHUT_RDWR);
            d->cut = true;
        }
        struct timespec next;
        clock_gettime(CLOCK_MONOTONIC, &next);
        next.tv_nsec += 250000000;  // a deadline is kept to within a quarter second
        next.tv_sec += next.tv_nsec / 1000000000, next.tv_nsec %= 1000000000;
        pthread_cond_timedwait(&deadlines_wake, &deadlines_lock, &next);
    }
    pthread_mutex_unlock(&deadlines_lock);
    return NULL;
}

static void deadlines_start(void) {
    pthread_condattr_t a;
    CHECK(pthread_condattr_init(&a) == 0);
    CHECK(pthread_condattr_setclock(&a, CLOCK_MONOTONIC) == 0);
    CHECK(pthread_cond_init(&deadlines_wake, &a) == 0);
    pthread_condattr_destroy(&a);
    deadlines_stop = false;
    CHECK(pthread_create(&deadlines_thread, NULL, deadlines_main, NULL) == 0);
    pthread_setname_np(deadlines_thread, "debug-deadlines");
}

static void deadlines_end(void) {
    pthread_mutex_lock(&deadlines_lock);
    deadlines_stop = true;
    pthread_cond_signal(&deadlines_wake);
    pthread_mutex_unlock(&deadlines_lock);
    CHECK(pthread_join(deadlines_thread, NULL) == 0);
    pthread_cond_destroy(&deadlines_wake);
}

bool debug_server_address_is_loopback(const char *address) {
    unsigned char a[16];
    static const unsigned char mapped[12] = {[10] = 0xff, [11] = 0xff};  // ::ffff:a.b.c.d
    if (inet_pton(AF_INET, address, a) == 1) return a[0] == 127;
    if (inet_pton(AF_INET6, address, a) != 1) return false;
    if (memcmp(a, mapped, sizeof mapped) == 0) return a[12] == 127;
    for (int i = 0; i < 15; i++)
        if (a[i]) return false;
    return a[15] == 1;
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
        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, LISTEN_BACKLOG) != 0) {
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
    deadlines_start();
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    if (ipv6) flags |= MHD_USE_IPv6;
    daemon_handle = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, NULL, MHD_OPTION_LISTEN_SOCKET, fd,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)SERVER_THREADS,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNECTIONS,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)MAX_CONNECTIONS_PER_CLIENT,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)REQUEST_SECONDS,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL,
        MHD_OPTION_EXTERNAL_LOGGER, on_server_log, NULL, MHD_OPTION_END);
    CHECK(daemon_handle != NULL);
    return true;
}

void debug_server_stop(void) {
    if (!daemon_handle) return;
    MHD_stop_daemon(daemon_handle);  // closes the listening socket too
    daemon_handle = NULL;
    deadlines_end();
    free((char *)server.config_yaml);
}
