// Reading HDF5 strings as their writers store them: variable-length (titan, h5py's str) or
// fixed-length (numpy bytes, other writers), ASCII or UTF-8. Shared by checkpoints (string
// attributes) and the FLUX shards (their attributes and caption lists).
#pragma once

#include <hdf5.h>

// The string in attribute obj, or in the one element of string dataset obj that file_space
// selects (file_space is ignored for an attribute). malloc'd; NULL when HDF5 cannot read it
// (a damaged file), for the caller to report in its own words.
char *h5_string_read(hid_t obj, hid_t file_space);
