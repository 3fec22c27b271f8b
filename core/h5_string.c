#include "core/h5_string.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"

static herr_t string_read_raw(hid_t obj, bool attr, hid_t mem_type, hid_t file_space, void *out) {
    if (attr) return H5Aread(obj, mem_type, out);
    hid_t one = H5Screate(H5S_SCALAR);
    H5_CHECK(one);
    herr_t rc = H5Dread(obj, mem_type, one, file_space, H5P_DEFAULT, out);
    H5_CHECK(H5Sclose(one));
    return rc;
}

char *h5_string_read(hid_t obj, hid_t file_space) {
    bool attr = H5Iget_type(obj) == H5I_ATTR;
    hid_t file_type = attr ? H5Aget_type(obj) : H5Dget_type(obj);
    H5_CHECK(file_type);
    htri_t variable = H5Tis_variable_str(file_type);
    H5_CHECK(variable);
    size_t size = H5Tget_size(file_type);
    // HDF5 does not convert between ASCII and UTF-8, so read in the file's own character set.
    H5T_cset_t cset = H5Tget_cset(file_type);
    H5_CHECK(cset);
    H5_CHECK(H5Tclose(file_type));
    hid_t mem_type = H5Tcopy(H5T_C_S1);
    H5_CHECK(mem_type);
    H5_CHECK(H5Tset_cset(mem_type, cset));
    char *out = NULL;
    if (variable) {
        char *vl = NULL;
        H5_CHECK(H5Tset_size(mem_type, H5T_VARIABLE));
        if (string_read_raw(obj, attr, mem_type, file_space, &vl) >= 0 && vl) {
            out = strcpy(xmalloc(strlen(vl) + 1), vl);
            H5_CHECK(H5free_memory(vl));
        }
    } else {
        // One more byte than stored: the memory type is NUL-terminated, the file's may be padded.
        H5_CHECK(H5Tset_size(mem_type, size + 1));
        out = xcalloc(size + 1, 1);
        if (string_read_raw(obj, attr, mem_type, file_space, out) < 0) free(out), out = NULL;
    }
    H5_CHECK(H5Tclose(mem_type));
    return out;
}
