// Hugging Face safetensors (huggingface/safetensors, README "Format"): an 8-byte little-endian
// header length N, N bytes of JSON mapping each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end]} (byte offsets into the data section that follows) plus an
// optional "__metadata__" object of strings, then the raw little-endian tensor bytes. A model
// too big for one file is split into shards named by model.safetensors.index.json's
// "weight_map" (tensor name -> file).
//
// Like checkpoint.h this knows no model: tensors are named by the caller. titan computes in
// fp32, so F32 and BF16 (the two dtypes checkpoints of Llama come in) are read into float,
// BF16 exactly; writing to BF16 rounds to nearest even (core/bf16.h). Tensors are read with
// pread straight into the caller's buffer (BF16 through a small staging buffer), never a whole
// file at once.
//
// Every malformed input (a header length the file cannot hold, JSON that is not a header,
// offsets outside the data or overlapping, a dtype other than F32/BF16, a shape whose bytes
// are not the offsets' span, a missing tensor) ends in one die_user line naming the file and
// the tensor; the safetensors_try_* forms return that line instead, as ckpt_try_load does.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "checkpoint/checkpoint.h"

typedef enum { SAFETENSORS_F32, SAFETENSORS_BF16 } SafetensorsDtype;

typedef struct {
    char *name;
    SafetensorsDtype dtype;
    int ndim;
    int64_t shape[CKPT_MAX_DIMS];
    uint64_t begin, end;  // byte range in its file's data section
    int file;             // index into Safetensors.files
} SafetensorsTensor;

typedef struct {
    char *path;
    int fd;
    uint64_t data_start;  // 8 + header length: where offset 0 of the data section lies
} SafetensorsFile;

// An opened model: one file, or every shard of an index.
typedef struct {
    char *path;  // as opened: a file, an index or a folder
    SafetensorsFile *files;
    int n_files;
    SafetensorsTensor *tensors;
    int n_tensors;
} Safetensors;

// path: a .safetensors file, or a folder holding model.safetensors.index.json (the shards it
// names) or else model.safetensors. Every header is validated here, before any data is read.
bool safetensors_try_open(const char *path, Safetensors *st, char *err, size_t errlen);
void safetensors_open(const char *path, Safetensors *st);
void safetensors_close(Safetensors *st);
// The tensor called name, or NULL.
const SafetensorsTensor *safetensors_find(const Safetensors *st, const char *name);
// out (shape) = tensor name as fp32; the tensor must exist with exactly this shape.
bool safetensors_try_read(const Safetensors *st, const char *name, int ndim, const int64_t *shape,
                          float *out, char *err, size_t errlen);
void safetensors_read(const Safetensors *st, const char *name, int ndim, const int64_t *shape,
                      float *out);

// Writing streams one tensor at a time, so that a caller may produce each (e.g. permuted) in
// a scratch buffer: begin writes the header for the listed tensors (their data unused), put
// appends the next one's values, end checks all were put and publishes the file atomically
// (written as <path>.tmp, fsynced, renamed, folder fsynced: as ckpt_save). The header's
// __metadata__ is {"format": "pt"}, which transformers requires of a PyTorch checkpoint.
typedef struct {
    char *path, *tmp;
    FILE *file;
    SafetensorsDtype dtype;
    const CkptTensor *tensors;
    int n_tensors, next;
} SafetensorsWriter;

void safetensors_write_begin(SafetensorsWriter *w, const char *path, const CkptTensor *tensors,
                             int n_tensors, SafetensorsDtype dtype);
// data: (tensors[next].shape) as fp32.
void safetensors_write_put(SafetensorsWriter *w, const float *data);
void safetensors_write_end(SafetensorsWriter *w);
// All of them at once, from each tensor's data.
void safetensors_save(const char *path, const CkptTensor *tensors, int n_tensors,
                      SafetensorsDtype dtype);
// "F32" / "BF16", as the header spells them.
const char *safetensors_dtype_name(SafetensorsDtype dtype);
