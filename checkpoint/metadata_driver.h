// An HDF5 file driver that can drop raw data writes: how rank 0 lays a checkpoint out (every
// dataset, its chunk index, the attributes) without holding its tensors, which every rank then
// writes itself into the chunks' places (checkpoint/save.c).
//
// It writes as the default (sec2) driver does, and the file it leaves is one the default driver
// opens, except that while dropping is on, writes of raw data (H5FD_MEM_DRAW: chunks, and the
// global heap, which HDF5 files as raw data: variable-length strings) are dropped. save.c turns
// it on around its direct chunk writes only, which HDF5 performs at once. Closing sets the
// file's size to its end of allocation, the chunks' places holes until written.
#pragma once

#include <hdf5.h>
#include <stdbool.h>

// A file access property list that uses the driver.
hid_t metadata_driver_fapl(void);
// Whether raw data writes are dropped from now on (off until turned on).
void metadata_driver_drop_raw(bool drop);
// The raw write dropped since the last call: true with its address and size when there was
// exactly one (a direct chunk write's: where HDF5 placed the chunk, which its chunk index
// lookup would find in time linear in the chunks), false otherwise.
bool metadata_driver_take_dropped(haddr_t *addr, size_t *size);
// The errno of the driver's first failed system call since the last call (0: none), which
// HDF5's error stack does not carry.
int metadata_driver_take_errno(void);
