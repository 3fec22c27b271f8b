// The checkpoint writer's own parts (checkpoint/save.c): the Fletcher32 it appends must be the
// one HDF5's filter computes, the chunk grid must put every chunk inside one writer's block,
// and a file laid out by rank 0 and filled with direct writes must read back exactly, edge
// chunks, boxes of several ranges and attributes in the global heap included.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <hdf5.h>
#include <string.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/chunk_grid.h"
#include "checkpoint/fletcher32.h"
#include "core/errors.h"

#include "tests/unit/test_support.h"

// HDF5 writes a chunk of n bytes through its Fletcher32 filter; the raw chunk it stored must
// be the bytes and h5_fletcher32_append's checksum. n odd covers the last half word, n large
// the folds every 360 words.
static void fletcher_matches_hdf5(size_t n) {
    char path[300];
    snprintf(path, sizeof path, "%s/fletcher-%zu.h5", dir, n);
    uint8_t *data = xmalloc(n), *ours = xmalloc(n + 4), *stored = xmalloc(n + 4);
    for (size_t i = 0; i < n; i++) data[i] = (uint8_t)(i * 2654435761u >> 13);
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t dims[1] = {n};
    hid_t space = H5Screate_simple(1, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    assert_true(H5Pset_chunk(dcpl, 1, dims) >= 0 && H5Pset_fletcher32(dcpl) >= 0);
    hid_t dset = H5Dcreate2(file, "x", H5T_STD_U8LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    assert_true(H5Dwrite(dset, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
    hsize_t origin[1] = {0}, size = 0;
    uint32_t filters = 1;
    assert_true(H5Dget_chunk_storage_size(dset, origin, &size) >= 0);
    assert_int_equal(size, n + 4);
    assert_true(H5Dread_chunk(dset, H5P_DEFAULT, origin, &filters, stored) >= 0);
    assert_int_equal(filters, 0);
    memcpy(ours, data, n);
    h5_fletcher32_append(ours, n);
    assert_memory_equal(ours, stored, n + 4);
    H5Dclose(dset), H5Pclose(dcpl), H5Sclose(space), H5Fclose(file);
    free(data), free(ours), free(stored);
}

static void test_fletcher32_is_hdf5s(void **state) {
    (void)state;
    size_t sizes[] = {1, 2, 3, 719, 720, 721, 1001, 4096, 1 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) fletcher_matches_hdf5(sizes[i]);
}

static CkptBlock block2(int64_t r0, int64_t rn, int64_t c0, int64_t cn) {
    return (CkptBlock){.start = {r0, c0}, .count = {rn, cn}};
}

// Every chunk of the grid lies in exactly one block: the blocks' chunk counts sum to the
// grid's, and each chunk origin a block yields is inside it and on the grid.
static void expect_tiles(const int64_t *shape, const CkptBlock *blocks, int n,
                         const int64_t *want_chunk) {
    int64_t chunk[CKPT_MAX_DIMS];
    chunk_grid_dims(2, shape, blocks, n, chunk);
    assert_int_equal(chunk[0], want_chunk[0]);
    assert_int_equal(chunk[1], want_chunk[1]);
    assert_true(chunk[0] * chunk[1] <= CHUNK_GRID_MAX_FLOATS);
    int64_t covered = 0;
    for (int b = 0; b < n; b++) {
        int64_t k = chunk_grid_block_count(2, shape, chunk, &blocks[b]);
        for (int64_t c = 0; c < k; c++) {
            int64_t origin[CKPT_MAX_DIMS];
            chunk_grid_origin(2, chunk, &blocks[b], c, origin);
            for (int d = 0; d < 2; d++) {
                assert_int_equal(origin[d] % chunk[d], 0);
                assert_true(origin[d] >= blocks[b].start[d]);
                assert_true(origin[d] < blocks[b].start[d] + blocks[b].count[d]);
            }
        }
        covered += k;
    }
    assert_int_equal(covered, chunk_grid_count(2, shape, chunk));
}

static void test_chunk_grid(void **state) {
    (void)state;
    // One writer: whole trailing rows, 4 MiB at most, spread evenly (8 chunks of 4000 rows,
    // not 7 of 4096 and a last of 3328).
    expect_tiles((int64_t[]){32000, 256}, (CkptBlock[]){block2(0, 32000, 0, 256)}, 1,
                 (int64_t[]){4000, 256});
    // FSDP's 4 row shards of 8000: chunks of 4000 rows, two per shard.
    CkptBlock fsdp[4];
    for (int r = 0; r < 4; r++) fsdp[r] = block2(8000 * r, 8000, 0, 256);
    expect_tiles((int64_t[]){32000, 256}, fsdp, 4, (int64_t[]){4000, 256});
    // Uneven shards (ceil(10 / 4) = 3 rows, the last one short): chunks of 3 rows.
    CkptBlock uneven[4] = {block2(0, 3, 0, 4), block2(3, 3, 0, 4), block2(6, 3, 0, 4),
                           block2(9, 1, 0, 4)};
    expect_tiles((int64_t[]){10, 4}, uneven, 4, (int64_t[]){3, 4});
    // FSDP's 3 shards of 4096 rows (1366, 1366, 1364): 1366 = 2 x 683, so chunks of 683 rows
    // (11 MiB), not 2 (32 KiB).
    CkptBlock thirds[3] = {block2(0, 1366, 0, 4096), block2(1366, 1366, 0, 4096),
                           block2(2732, 1364, 0, 4096)};
    expect_tiles((int64_t[]){4096, 4096}, thirds, 3, (int64_t[]){683, 4096});
    // Column shards (tensor parallel's rowwise weights) under row shards (FSDP).
    CkptBlock grid[4] = {block2(0, 4, 0, 3), block2(0, 4, 3, 3), block2(4, 4, 0, 3),
                         block2(4, 4, 3, 3)};
    expect_tiles((int64_t[]){8, 6}, grid, 4, (int64_t[]){4, 3});
    // A row of more than 4 MiB: split along the columns, rows of one.
    expect_tiles((int64_t[]){3, 3 << 20}, (CkptBlock[]){block2(0, 3, 0, 3 << 20)}, 1,
                 (int64_t[]){1, 1 << 20});
}

// Arbitrary finite floats.
static void fill(float *x, int64_t n, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed ^= seed << 13, seed ^= seed >> 17, seed ^= seed << 5;
        x[i] = (float)(int32_t)seed / 65536.0f;
    }
}

// Boxes of several ranges per dim (FLUX's fused weights under a blocked shard) are written as
// several blocks; a 5 x 3 tensor in blocks of 2 rows leaves an edge chunk of one row. The file
// reads back exactly, through HDF5's checksums.
static void test_multi_range_box_and_edge_chunks(void **state) {
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/blocks.h5", dir);
    static const int64_t shape[2] = {5, 3};
    float data[15], back[15];
    fill(data, 15, 9);
    ParamBox box = {.ndim = 2, .count = {5, 3},
                    .ranges = {{.n = 3, .start = {0, 2, 4}, .count = {2, 2, 1}},
                               {.n = 2, .start = {0, 1}, .count = {1, 2}}}};
    CkptTensor t = {.path = "/w", .ndim = 2, .shape = shape, .data = data, .box = &box};
    ckpt_save(path, &t, 1, NULL, 0, MPI_COMM_NULL);
    CkptTensor r = {.path = "/w", .ndim = 2, .shape = shape, .data = back};
    ckpt_load(path, &r, 1);
    assert_memory_equal(back, data, sizeof data);
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t dset = H5Dopen2(file, "/w", H5P_DEFAULT), dcpl = H5Dget_create_plist(dset);
    hsize_t chunk[2];
    assert_int_equal(H5Pget_chunk(dcpl, 2, chunk), 2);
    assert_int_equal(chunk[0], 2);  // the rows' boundaries 2 and 4 and the columns' 1
    assert_int_equal(chunk[1], 1);
    H5Pclose(dcpl), H5Dclose(dset), H5Fclose(file);
}

// Hundreds of small tensors (their chunks placed between metadata) and attributes in the
// global heap (a long variable-length string) read back whole.
static void test_small_tensors_and_heap_attributes(void **state) {
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/small.h5", dir);
    enum { N = 200 };
    static int64_t shapes[N];
    static char names[N][32];
    CkptTensor saved[N], loaded[N];
    for (int i = 0; i < N; i++) {
        shapes[i] = 1 + i * 7;
        snprintf(names[i], sizeof names[i], "/g%d/t%d", i % 5, i);
        saved[i] = (CkptTensor){.path = names[i], .ndim = 1, .shape = &shapes[i],
                                .data = xmalloc((size_t)shapes[i] * sizeof(float))};
        fill(saved[i].data, shapes[i], (uint32_t)i + 1);
        loaded[i] = saved[i];
        loaded[i].data = xcalloc((size_t)shapes[i], sizeof(float));
    }
    char *config = xmalloc(100001);
    for (int i = 0; i < 100000; i++) config[i] = (char)('a' + i % 26);
    config[100000] = '\0';
    CkptAttr attrs[] = {{.name = "config", .type = CKPT_STRING, .s = config},
                        {.name = "note", .type = CKPT_STRING, .s = "short"},
                        {.name = "step", .type = CKPT_INT, .i = 42}};
    ckpt_save(path, saved, N, attrs, 3, MPI_COMM_NULL);
    ckpt_load(path, loaded, N);
    for (int i = 0; i < N; i++) {
        assert_memory_equal(loaded[i].data, saved[i].data, (size_t)shapes[i] * sizeof(float));
        free(saved[i].data), free(loaded[i].data);
    }
    char *back = ckpt_read_string(path, "config"), *note = ckpt_read_string(path, "note");
    assert_string_equal(back, config);
    assert_string_equal(note, "short");
    assert_int_equal(ckpt_read_int(path, "step"), 42);
    free(back), free(note), free(config);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fletcher32_is_hdf5s),
        cmocka_unit_test(test_chunk_grid),
        cmocka_unit_test(test_multi_range_box_and_edge_chunks),
        cmocka_unit_test(test_small_tensors_and_heap_attributes),
    };
    return cmocka_run_group_tests(tests, dir_setup, dir_teardown);
}
