// TensorBoard event files, written without TensorFlow: a file of TFRecords (each a uint64
// length, the masked CRC-32C of the length, the data, the masked CRC-32C of the data) holding
// Event protobufs whose Summary carries one scalar (simple_value), as torch's SummaryWriter
// writes them. TensorBoard, tbparse and tf.data read every file named *tfevents* in a folder.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

typedef struct {
    FILE *file;  // NULL: not writing
    char path[4096 + 128];
    off_t flushed;  // the file's size after its last complete flush
} TbWriter;

// Starts a new events file in folder (created). Its first events are the format version and a
// restart at first_step (torch SummaryWriter's purge_step): TensorBoard hides the events of
// steps >= first_step that the folder's older files hold, so a resumed run replaces the steps
// after its checkpoint and a fresh run (first_step 1) the earlier runs', as metrics.jsonl does.
void tb_open(TbWriter *w, const char *folder, int64_t first_step);
// One scalar at step, stored as a float (Summary.Value.simple_value is a float).
void tb_add_scalar(TbWriter *w, const char *tag, int64_t step, double value);
// Hands what was added to the file system, so TensorBoard shows it live and a crash keeps it.
// A failed flush closes the writer (file NULL) and defers the run's error (core/errors.h).
void tb_flush(TbWriter *w);
void tb_close(TbWriter *w);

// The format's pieces, for tests.
// CRC-32C (Castagnoli, RFC 3720's iSCSI checksum): reflected polynomial 0x82F63B78.
uint32_t tb_crc32c(const void *data, size_t n);
// TFRecord framing of n bytes of data.
void tb_write_record(FILE *f, const void *data, size_t n);
// The Event of one scalar, serialized into buf (cap bytes); returns its length.
size_t tb_encode_scalar(uint8_t *buf, size_t cap, double wall_time, int64_t step, const char *tag,
                        float value);
