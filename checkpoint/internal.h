// What checkpoint.c (loads, attributes, the folder) and save.c (the writer) share.
#pragma once

#include <hdf5.h>
#include <mpi.h>
#include <stddef.h>

// HDF5 prints its whole error stack on every failure; titan reports one line of its own.
void ckpt_hdf5_silence(void);
// The folder of path ("." for a bare name).
void ckpt_dir_of(const char *path, char *out, size_t n);
// This process's rank among comm's ranks and their number; MPI_COMM_NULL: a job of one.
int ckpt_comm_ranks(MPI_Comm comm, int *rank);
