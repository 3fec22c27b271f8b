// Step metrics: one console line per log step on rank 0 and the same figures, at full
// precision, as one JSON object per line in <dump_folder>/metrics.jsonl.
#pragma once

#include <stdio.h>

typedef struct {
    int step;
    double loss, grad_norm, lr;
    double tokens_per_s;      // per device
    double tflops;            // achieved model TFLOP/s per device
    double mfu;               // tflops / peak, in percent; NAN when the peak is unknown
    double peak_memory_gib;   // resident set high-water mark of this process
} StepMetrics;

typedef struct {
    FILE *jsonl;  // NULL on ranks that do not log
} MetricsLog;

void metrics_open(MetricsLog *log, const char *dump_folder);
void metrics_write(MetricsLog *log, const StepMetrics *m);
// The validation loss after `step` (torchtitan's "validate step" line).
void metrics_write_validation(MetricsLog *log, int step, double loss);
void metrics_close(MetricsLog *log);
double metrics_peak_rss_gib(void);
