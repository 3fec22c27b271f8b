#include "core/metrics.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <sys/resource.h>

#include "core/errors.h"
#include "core/files.h"

void metrics_open(MetricsLog *log, const char *dump_folder) {
    char path[4096];
    make_dirs(dump_folder);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dump_folder);
    log->jsonl = fopen(path, "w");
    if (!log->jsonl) die_user("cannot write %s: %s", path, strerror(errno));
}

void metrics_write(MetricsLog *log, const StepMetrics *m) {
    char mfu[32], mfu_json[32];
    bool known = !isnan(m->mfu);
    snprintf(mfu, sizeof mfu, known ? "%5.2f%%" : "  n/a", m->mfu);
    snprintf(mfu_json, sizeof mfu_json, known ? "%.6g" : "null", m->mfu);
    log_info("step %5d  loss %8.4f  grad_norm %7.4f  lr %.3e  tok/s %9.0f  TFLOP/s %6.3f  "
             "MFU %s  mem %.2f GiB",
             m->step, m->loss, m->grad_norm, m->lr, m->tokens_per_s, m->tflops, mfu,
             m->peak_memory_gib);
    if (!log->jsonl) return;  // not the logging rank
    fprintf(log->jsonl,
            "{\"step\": %d, \"loss\": %.17g, \"grad_norm\": %.17g, \"lr\": %.17g, "
            "\"tokens_per_s\": %.6g, \"tflops\": %.6g, \"mfu\": %s, \"peak_memory_gib\": %.6g}\n",
            m->step, m->loss, m->grad_norm, m->lr, m->tokens_per_s, m->tflops, mfu_json,
            m->peak_memory_gib);
    fflush(log->jsonl);
}

void metrics_write_validation(MetricsLog *log, int step, double loss) {
    log_info("validate step %5d  loss %8.4f", step, loss);
    if (!log->jsonl) return;
    fprintf(log->jsonl, "{\"step\": %d, \"validation_loss\": %.17g}\n", step, loss);
    fflush(log->jsonl);
}

void metrics_close(MetricsLog *log) {
    if (log->jsonl) fclose(log->jsonl);
    log->jsonl = NULL;
}

double metrics_peak_rss_gib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / (1024.0 * 1024.0);  // ru_maxrss is in KiB on Linux
}
