#include "core/tensorboard.h"

#include <dirent.h>
#include <stdio_ext.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/errors.h"
#include "core/files.h"

// ---- protobuf wire format (protobuf.dev/programming-guides/encoding) ----------------------
// A field is a varint key, (field number << 3) | wire type, then its value: a varint, 8 or 4
// little-endian bytes, or a varint length and that many bytes (strings, nested messages).
enum { PB_VARINT = 0, PB_FIXED64 = 1, PB_BYTES = 2, PB_FIXED32 = 5 };

// The field numbers of the few fields written.
// tensorflow/core/util/event.proto: message Event { double wall_time = 1; int64 step = 2;
// oneof what { string file_version = 3; Summary summary = 5; SessionLog session_log = 7; } }
enum { EVENT_WALL_TIME = 1, EVENT_STEP = 2, EVENT_FILE_VERSION = 3, EVENT_SUMMARY = 5,
       EVENT_SESSION_LOG = 7 };
// The same file: message SessionLog { SessionStatus status = 1; }, enum SessionStatus
// { STATUS_UNSPECIFIED = 0; START = 1; ... }.
enum { SESSION_LOG_STATUS = 1, SESSION_START = 1 };
// tensorflow/core/framework/summary.proto: message Summary { repeated Value value = 1; },
// message Value { string tag = 1; oneof value { float simple_value = 2; ... } }.
enum { SUMMARY_VALUE = 1, VALUE_TAG = 1, VALUE_SIMPLE_VALUE = 2 };

typedef struct {
    uint8_t *p;
    size_t n, cap;
} PbBuf;

static void pb_put(PbBuf *b, const void *data, size_t n) {
    CHECK(n <= b->cap - b->n);  // the callers' buffers fit titan's own tags
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void pb_varint(PbBuf *b, uint64_t v) {
    do {
        uint8_t byte = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        pb_put(b, &byte, 1);
        v >>= 7;
    } while (v);
}

static void store_le(uint8_t *out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) out[i] = (uint8_t)(v >> (8 * i));
}

static void pb_key(PbBuf *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | wire); }

static void pb_uint(PbBuf *b, int field, uint64_t v) {
    pb_key(b, field, PB_VARINT);
    pb_varint(b, v);
}

static void pb_double(PbBuf *b, int field, double x) {
    uint64_t bits;
    uint8_t le[8];
    memcpy(&bits, &x, sizeof bits);
    store_le(le, bits, 8);
    pb_key(b, field, PB_FIXED64);
    pb_put(b, le, 8);
}

static void pb_float(PbBuf *b, int field, float x) {
    uint32_t bits;
    uint8_t le[4];
    memcpy(&bits, &x, sizeof bits);
    store_le(le, bits, 4);
    pb_key(b, field, PB_FIXED32);
    pb_put(b, le, 4);
}

static void pb_bytes(PbBuf *b, int field, const void *data, size_t n) {
    pb_key(b, field, PB_BYTES);
    pb_varint(b, n);
    pb_put(b, data, n);
}

// ---- events --------------------------------------------------------------------------------
enum { TAG_MAX = 256, EVENT_MAX = TAG_MAX + 64 };

// Every Event's first fields. int64 is a varint of the two's complement (10 bytes if negative).
static void event_begin(PbBuf *e, double wall_time, int64_t step) {
    pb_double(e, EVENT_WALL_TIME, wall_time);
    pb_uint(e, EVENT_STEP, (uint64_t)step);
}

size_t tb_encode_scalar(uint8_t *buf, size_t cap, double wall_time, int64_t step, const char *tag,
                        float value) {
    uint8_t value_msg[TAG_MAX + 16], summary[TAG_MAX + 32];
    PbBuf v = {value_msg, 0, sizeof value_msg}, s = {summary, 0, sizeof summary};
    pb_bytes(&v, VALUE_TAG, tag, strlen(tag));
    pb_float(&v, VALUE_SIMPLE_VALUE, value);
    pb_bytes(&s, SUMMARY_VALUE, v.p, v.n);
    PbBuf e = {buf, 0, cap};
    event_begin(&e, wall_time, step);
    pb_bytes(&e, EVENT_SUMMARY, s.p, s.n);
    return e.n;
}

// ---- records -------------------------------------------------------------------------------
uint32_t tb_crc32c(const void *data, size_t n) {
    static uint32_t table[256];  // the CRC of each byte value; table[1] is nonzero once built
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
    const uint8_t *p = data;
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

// TensorFlow's crc32c::Mask: a CRC stored next to data it covers is rotated and offset, since
// the CRC of a string that embeds CRCs is otherwise degenerate (tensorflow/core/lib/hash/crc32c.h).
static uint32_t crc_masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

void tb_write_record(FILE *f, const void *data, size_t n) {
    uint8_t header[12], footer[4];
    store_le(header, n, 8);
    store_le(header + 8, crc_masked(tb_crc32c(header, 8)), 4);
    store_le(footer, crc_masked(tb_crc32c(data, n)), 4);
    // A failed write leaves the stream's error flag, which tb_flush reports.
    fwrite(header, 1, sizeof header, f);
    fwrite(data, 1, n, f);
    fwrite(footer, 1, sizeof footer, f);
}

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void tb_add_scalar(TbWriter *w, const char *tag, int64_t step, double value) {
    uint8_t event[EVENT_MAX];
    tb_write_record(w->file, event,
                    tb_encode_scalar(event, sizeof event, wall_seconds(), step, tag, (float)value));
}

// A failed flush (ENOSPC, EDQUOT, EIO) may have written part of the records: the file is cut
// back to the end of the last flush, stdio's unwritten rest dropped (exit would write it), so
// that TensorBoard finds only whole records; the writer closes, and the run stops (core/
// errors.h's deferred error).
void tb_flush(TbWriter *w) {
    if (fflush(w->file) == 0 && !ferror(w->file)) {
        w->flushed = ftello(w->file);
        return;
    }
    int err = errno ? errno : EIO;
    __fpurge(w->file);
    if (ftruncate(fileno(w->file), w->flushed) != 0) err = errno;
    fclose(w->file);
    w->file = NULL;
    char why[128];
    defer_user_error("tensorboard: %s writing %s: %s or set job.dump_folder elsewhere",
                     write_error_why(err, why, sizeof why), w->path, write_error_remedy(err));
}

// The seconds in a new file's name: now, or one past the newest events file already in the
// folder, since TensorBoard reads a folder's files in name order and a restart must come
// after the run it restarts, even within the same second.
static long long file_seconds(const char *folder) {
    long long newest = -1, s;
    DIR *d = opendir(folder);
    if (!d) die_user("cannot read %s: %s", folder, strerror(errno));
    for (struct dirent *e; (e = readdir(d));)
        if (sscanf(e->d_name, "events.out.tfevents.%lld", &s) == 1 && s > newest) newest = s;
    closedir(d);
    long long now = (long long)time(NULL);
    return now > newest ? now : newest + 1;
}

void tb_open(TbWriter *w, const char *folder, int64_t first_step) {
    make_dirs(folder);
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
    // torch SummaryWriter's name: TensorBoard takes any file with "tfevents" in its name.
    snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010lld.%s.%d.0", folder,
             file_seconds(folder), host, (int)getpid());
    w->file = fopen(w->path, "wb");
    w->flushed = 0;
    if (!w->file) die_user("cannot write %s: %s", w->path, strerror(errno));
    static const char version[] = "brain.Event:2";  // what TensorBoard requires of a file
    uint8_t event[EVENT_MAX], session[8];
    double now = wall_seconds();
    PbBuf e = {event, 0, sizeof event}, s = {session, 0, sizeof session};
    event_begin(&e, now, first_step);
    pb_bytes(&e, EVENT_FILE_VERSION, version, strlen(version));
    tb_write_record(w->file, e.p, e.n);
    pb_uint(&s, SESSION_LOG_STATUS, SESSION_START);
    e.n = 0;
    event_begin(&e, now, first_step);
    pb_bytes(&e, EVENT_SESSION_LOG, s.p, s.n);
    tb_write_record(w->file, e.p, e.n);
    tb_flush(w);
}

void tb_close(TbWriter *w) {
    if (!w->file) return;
    tb_flush(w);
    if (w->file) fclose(w->file);
    w->file = NULL;
}
