// TensorBoard event files: CRC-32C against RFC 3720's test vectors, Event protobufs and their
// TFRecord framing byte for byte against what TensorBoard's own Python writer produces, and a
// file's first events, record by record; an events folder that cannot be made is one line,
// exit 2.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "core/tensorboard.h"

#include "tests/unit/test_support.h"

// RFC 3720 (iSCSI), appendix B.4: the CRC-32C of 32 bytes of zeros, of ones, incrementing and
// decrementing, and the catalogue check value of "123456789".
static void test_crc32c_rfc3720(void **state) {
    (void)state;
    uint8_t buf[32];
    memset(buf, 0, sizeof buf);
    assert_int_equal(tb_crc32c(buf, sizeof buf), 0x8A9136AAu);
    memset(buf, 0xff, sizeof buf);
    assert_int_equal(tb_crc32c(buf, sizeof buf), 0x62A8AB43u);
    for (int i = 0; i < 32; i++) buf[i] = (uint8_t)i;
    assert_int_equal(tb_crc32c(buf, sizeof buf), 0x46DD794Eu);
    for (int i = 0; i < 32; i++) buf[i] = (uint8_t)(31 - i);
    assert_int_equal(tb_crc32c(buf, sizeof buf), 0x113FDB5Cu);
    assert_int_equal(tb_crc32c("123456789", 9), 0xE3069283u);
    assert_int_equal(tb_crc32c("", 0), 0);
}

// tensorboard 2.x (pip), tensorboard.compat.proto: Event(wall_time=1.5, step=7,
// summary=Summary(value=[Summary.Value(tag="loss_metrics/global_avg_loss", simple_value=2.5)]))
// .SerializeToString(), then framed by tensorboard.summary.writer.record_writer.RecordWriter.
static const uint8_t LOSS_EVENT[] = {
    0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf8, 0x3f, 0x10, 0x07, 0x2a, 0x25, 0x0a, 0x23,
    0x0a, 0x1c, 0x6c, 0x6f, 0x73, 0x73, 0x5f, 0x6d, 0x65, 0x74, 0x72, 0x69, 0x63, 0x73, 0x2f,
    0x67, 0x6c, 0x6f, 0x62, 0x61, 0x6c, 0x5f, 0x61, 0x76, 0x67, 0x5f, 0x6c, 0x6f, 0x73, 0x73,
    0x15, 0x00, 0x00, 0x20, 0x40};
static const uint8_t LOSS_RECORD_HEADER[] = {0x32, 0x00, 0x00, 0x00, 0x00, 0x00,
                                             0x00, 0x00, 0x24, 0x19, 0x56, 0xec};
static const uint8_t LOSS_RECORD_FOOTER[] = {0x6b, 0xd3, 0xbc, 0x52};
// The same with step=300 (a two-byte varint), tag "lr/AdamW", simple_value=3e-4.
static const uint8_t LR_EVENT[] = {0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf8, 0x3f, 0x10,
                                   0xac, 0x02, 0x2a, 0x11, 0x0a, 0x0f, 0x0a, 0x08, 0x6c, 0x72,
                                   0x2f, 0x41, 0x64, 0x61, 0x6d, 0x57, 0x15, 0x52, 0x49, 0x9d,
                                   0x39};

static void test_event_bytes(void **state) {
    (void)state;
    uint8_t buf[512];
    size_t n = tb_encode_scalar(buf, sizeof buf, 1.5, 7, "loss_metrics/global_avg_loss", 2.5f);
    assert_int_equal(n, sizeof LOSS_EVENT);
    assert_memory_equal(buf, LOSS_EVENT, n);
    n = tb_encode_scalar(buf, sizeof buf, 1.5, 300, "lr/AdamW", 3e-4f);
    assert_int_equal(n, sizeof LR_EVENT);
    assert_memory_equal(buf, LR_EVENT, n);
}

static void test_record_framing(void **state) {
    (void)state;
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    tb_write_record(f, LOSS_EVENT, sizeof LOSS_EVENT);
    fclose(f);
    assert_int_equal(len, 12 + sizeof LOSS_EVENT + 4);
    assert_memory_equal(out, LOSS_RECORD_HEADER, 12);
    assert_memory_equal(out + 12, LOSS_EVENT, sizeof LOSS_EVENT);
    assert_memory_equal(out + 12 + sizeof LOSS_EVENT, LOSS_RECORD_FOOTER, 4);
    free(out);
}

// The record at *at in file (len bytes): its data's offset and length; *at moves past it.
static size_t record_next(const char *file, size_t len, size_t *at, size_t *data_len) {
    assert_true(*at + 12 <= len);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)(uint8_t)file[*at + i] << (8 * i);
    size_t data = *at + 12;
    assert_true(data + n + 4 <= len);
    *at = data + n + 4;
    *data_len = n;
    return data;
}

// A file opened at step 5: the version, the restart at 5 (SessionLog START), then the scalar.
static void test_file(void **state) {
    (void)state;
    char folder[512], first[sizeof((TbWriter){0}.path)];
    path_make(folder, sizeof folder, "tb/rank_0");
    TbWriter w = {0};
    tb_open(&w, folder, 5);
    tb_add_scalar(&w, "grad_norm", 5, 0.25);
    snprintf(first, sizeof first, "%s", w.path);
    tb_close(&w);
    assert_null(w.file);
    assert_non_null(strstr(first, "/tb/rank_0/events.out.tfevents."));

    size_t len = 0, at = 0, n;
    char *file = file_slurp(first, &len);
    assert_non_null(file);
    size_t data = record_next(file, len, &at, &n);
    static const char version[] = {0x10, 0x05, 0x1a, 13, 'b', 'r', 'a', 'i', 'n', '.', 'E',
                                   'v', 'e', 'n', 't', ':', '2'};
    assert_int_equal(n, 9 + sizeof version);  // wall_time first: key and 8 bytes
    assert_memory_equal(file + data + 9, version, sizeof version);
    data = record_next(file, len, &at, &n);
    static const char restart[] = {0x10, 0x05, 0x3a, 0x02, 0x08, 0x01};
    assert_int_equal(n, 9 + sizeof restart);
    assert_memory_equal(file + data + 9, restart, sizeof restart);
    data = record_next(file, len, &at, &n);
    uint8_t want[64];
    assert_int_equal(n, tb_encode_scalar(want, sizeof want, 0, 5, "grad_norm", 0.25f));
    assert_memory_equal(file + data + 9, want + 9, n - 9);
    assert_int_equal(at, len);
    free(file);

    // A second run's file in the same folder, opened within the same second, reads after it.
    tb_open(&w, folder, 3);
    assert_true(strcmp(w.path, first) > 0);
    tb_close(&w);
}

static void open_under_file(const char *folder) {
    TbWriter w = {0};
    tb_open(&w, folder, 1);
}

static void test_unwritable(void **state) {
    (void)state;
    char file[512], folder[600], want[1024];
    path_make(file, sizeof file, "plain_file");
    bytes_write(file, "x", 1);
    snprintf(folder, sizeof folder, "%s/tb", file);
    snprintf(want, sizeof want, "titan: error: cannot create directory %s: Not a directory\n",
             folder);
    expect_die_user(open_under_file, folder, want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_rfc3720),
        cmocka_unit_test(test_event_bytes),
        cmocka_unit_test(test_record_framing),
        cmocka_unit_test(test_file),
        cmocka_unit_test(test_unwritable),
    };
    return cmocka_run_group_tests(tests, dir_setup, dir_teardown);
}
