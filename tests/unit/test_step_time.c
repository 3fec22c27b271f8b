// The step-time predictor (kernels/step_time.h) against hand computations on a made-up device
// of round rates: each term is its work over its rate, float8 falls back to bf16's rate where
// the device has none, compute is shared by the ranks on a device, a blocking collective adds
// while an overlapped one adds only what exceeds the compute, a group wider than a node takes
// the network, and the pipeline's bubble stretches the whole. The kept device rows
// (kernels/device_table.c) are found by name and by a GPU's device name. The cpu probe measures
// every rate asked for, in about the time it is given; its GEMM peak is measured once, and
// again on request, keeping the higher.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <time.h>

#include "kernels/cpu/cpu.h"
#include "kernels/device.h"
#include "kernels/step_time.h"

// 1 TFLOP/s fp32, 4 bf16, no float8; attention 2 TFLOP/s; elementwise 1 TB/s, the optimizer
// 0.5 TB/s, float8's casts 0.25 TB/s; 10 us per op; 100 GB/s in a node of 8, 10 GB/s between
// nodes.
static const DeviceTable DEVICE = {
    .name = "test", .source = "hand", .peak = {0, 8e12, 0}, .gemm = {1e12, 4e12, 0},
    .attention = 2e12, .attention_head_dim = 128, .memory = 1e12, .optimizer = 0.5e12,
    .cast = 0.25e12, .op = 1e-5,
    .link_node = 100e9, .link_network = 10e9, .devices_per_node = 8};

static void test_terms_are_work_over_rate(void **state) {
    (void)state;
    StepWork w = {.gemm_flops = {1e12, 8e12, 4e12}, .attention_flops = 1e12,
                  .elementwise_bytes = 5e11, .cast_bytes = 1e11, .optimizer_bytes = 2e11,
                  .ops = 1000, .sharing = 1};
    StepTime s = predict_step_time(&w, &DEVICE);
    // fp32 1 s; bf16 2 s; float8 at bf16's rate (the device has none) 1 s
    assert_float_equal(s.gemm, 4.0, 1e-12);
    assert_float_equal(s.attention, 0.5, 1e-12);
    assert_float_equal(s.elementwise, 0.5, 1e-12);
    assert_float_equal(s.casts, 0.4, 1e-12);
    assert_float_equal(s.optimizer, 0.4, 1e-12);
    assert_float_equal(s.ops, 0.01, 1e-12);
    assert_float_equal(s.compute, 5.81, 1e-12);
    assert_float_equal(s.step, 5.81, 1e-12);
    DeviceTable fast = DEVICE;
    fast.gemm[GEMM_FLOAT8] = 8e12;  // float8 at its own rate once the device has one
    assert_float_equal(predict_step_time(&w, &fast).gemm, 3.5, 1e-12);
    w.sharing = 2;  // two ranks on the device: each gets half of it
    assert_float_equal(predict_step_time(&w, &DEVICE).compute, 11.62, 1e-12);
}

static void test_collectives_block_or_overlap(void **state) {
    (void)state;
    StepWork w = {.gemm_flops = {1e12}, .sharing = 1, .n_groups = 3,
                  .groups = {{"tp", 50e9, true, 8},            // in a node: 0.5 s, blocking
                             {"fsdp", 40e9, false, 64},        // across nodes: 4 s, overlapped
                             {"dp_replicate", 0, false, 512}}};  // none moved: no time
    StepTime s = predict_step_time(&w, &DEVICE);
    assert_float_equal(s.compute, 1.0, 1e-12);
    assert_float_equal(s.blocking, 0.5, 1e-12);
    assert_float_equal(s.overlapped, 4.0, 1e-12);
    assert_float_equal(s.exposed, 3.0, 1e-12);  // 4 s of traffic under 1 s of compute
    assert_float_equal(s.step, 4.5, 1e-12);
    w.groups[1].span = 8;  // in a node: 0.4 s, hidden by the compute
    s = predict_step_time(&w, &DEVICE);
    assert_float_equal(s.exposed, 0.0, 1e-12);
    assert_float_equal(s.step, 1.5, 1e-12);
    DeviceTable one_node = DEVICE;
    one_node.devices_per_node = 0;  // every rank on one node: no group takes the network
    w.groups[1].span = 4096;
    assert_float_equal(predict_step_time(&w, &one_node).step, 1.5, 1e-12);
}

static void test_bubble_stretches_the_step(void **state) {
    (void)state;
    StepWork w = {.gemm_flops = {3e12}, .sharing = 1, .bubble = 0.25};
    assert_float_equal(predict_step_time(&w, &DEVICE).step, 4.0, 1e-12);  // 3 s / 0.75
}

static void test_kept_rows(void **state) {
    (void)state;
    const DeviceTable *h100 = device_table_named("h100");
    assert_non_null(h100);
    assert_string_equal(h100->name, "H100 SXM");
    assert_ptr_equal(device_table_named("H100 SXM"), h100);
    assert_ptr_equal(device_table_for_gpu("NVIDIA H100 80GB HBM3"), h100);
    assert_string_equal(device_table_for_gpu("NVIDIA H100 PCIe")->name, "H100 PCIe");
    assert_string_equal(device_table_for_gpu("NVIDIA H200")->name, "H200 SXM");
    assert_null(device_table_named("H300"));
    assert_null(device_table_for_gpu("Radeon"));
    assert_float_equal(h100->peak[GEMM_BF16], 989e12, 1);  // MFU's denominator, as torchtitan's
    char names[256];
    device_table_names(names, sizeof names);
    assert_non_null(strstr(names, "H100 SXM, H200 SXM"));
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_cpu_probe(void **state) {
    (void)state;
    char why[256];
    KernelInit init = {.precision = {DTYPE_FP32, DTYPE_FP32}};
    assert_true(kernels_cpu.init(&init, why, sizeof why));
    ProbeShape shape = {.compute = DTYPE_FP32, .rows = 512, .dim = 256, .head_dim = 16,
                        .seq_len = 256, .float8 = true};
    double peak = kernels_cpu.peak_flops(false);  // its ramp to the clocks first, as a run's
                                                  // MFU line does
    // Kept, and measured again only when asked (a run that outpaced it), keeping the higher.
    assert_true(peak > 0 && kernels_cpu.peak_flops(false) == peak);
    double again = kernels_cpu.peak_flops(true);
    assert_true(again >= peak && kernels_cpu.peak_flops(false) == again);
    double began = seconds_now();
    DeviceTable d = device_probe(&kernels_cpu, &shape, 0.2);
    // 0.2 s asked: a guard against a probe that runs away, not a timing (a loaded CI host took
    // over 10 s)
    assert_true(seconds_now() - began < 120.0);
    assert_true(d.gemm[GEMM_FP32] > 0 && d.gemm[GEMM_FLOAT8] > 0 && d.gemm[GEMM_BF16] == 0);
    assert_true(d.peak[GEMM_FP32] > 0 && d.attention > 0 && d.memory > 0 && d.optimizer > 0);
    assert_true(d.op > 0 && d.cast > 0);  // float8 asked for: its casts measured too
    assert_int_equal(d.attention_head_dim, 16);
    assert_int_equal(d.devices_per_node, 0);
    assert_true(d.link_node == d.memory);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_terms_are_work_over_rate),
        cmocka_unit_test(test_collectives_block_or_overlap),
        cmocka_unit_test(test_bubble_stretches_the_step),
        cmocka_unit_test(test_kept_rows),
        cmocka_unit_test(test_cpu_probe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
