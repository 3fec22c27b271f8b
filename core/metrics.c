#include "core/metrics.h"

#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/errors.h"
#include "core/files.h"

static bool env_set(const char *name) {
    const char *v = getenv(name);
    return v && *v;
}

bool metrics_use_color(bool disabled, bool launched) {
    if (disabled || env_set("NO_COLOR") || !isatty(STDOUT_FILENO)) return false;
    return !launched || env_set("FORCE_COLOR");
}

// A complete row (newline-terminated: a crash may have cut the last one) of a step up to
// `through`. Every row, training or validation, starts with its step.
static bool row_kept(const char *line, int64_t through) {
    long long step;
    size_t n = strlen(line);
    return n > 0 && line[n - 1] == '\n' && sscanf(line, "{\"step\": %lld", &step) == 1 &&
           step <= through;
}

// Rewrites path with only its rows of steps up to `through`, through a temporary file renamed
// over it (data synced first), so a crash leaves the old file or the new one, never half.
static void rows_keep_through(const char *path, int64_t through) {
    FILE *in = fopen(path, "r");
    if (!in) {
        if (errno == ENOENT) return;  // nothing to keep
        die_user("cannot read %s: %s", path, strerror(errno));
    }
    char tmp[4096 + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "w");
    if (!out) die_user("cannot write %s: %s", tmp, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, in) >= 0)
        if (row_kept(line, through) && fputs(line, out) < 0)
            die_user("cannot write %s: %s", tmp, strerror(errno));
    free(line);
    fclose(in);
    if (fflush(out) != 0 || fsync(fileno(out)) != 0 || fclose(out) != 0)
        die_user("cannot write %s: %s", tmp, strerror(errno));
    if (rename(tmp, path) != 0) die_user("cannot replace %s: %s", path, strerror(errno));
}

void metrics_open(MetricsLog *log, const char *dump_folder, int rank, int64_t resumed_step) {
    char path[4096];
    make_dirs(dump_folder);
    if (rank == 0) snprintf(path, sizeof path, "%s/metrics.jsonl", dump_folder);
    else snprintf(path, sizeof path, "%s/metrics_rank%d.jsonl", dump_folder, rank);
    if (resumed_step > 0) rows_keep_through(path, resumed_step);
    log->jsonl = fopen(path, resumed_step > 0 ? "a" : "w");
    if (!log->jsonl) die_user("cannot write %s: %s", path, strerror(errno));
    snprintf(log->jsonl_path, sizeof log->jsonl_path, "%s", path);
}

// One record, a whole line, appended with one write(2) past stdio's buffer (which would write
// a failed record again at exit). A write the disk refuses or cuts short (ENOSPC, EDQUOT, EIO)
// is undone by truncating the file back to the record's start, so that it never holds half a
// record, and stops the run (core/errors.h's deferred error): nothing more is written.
static void record_append(MetricsLog *log, const char *line) {
    if (deferred_user_error()) return;
    size_t n = strlen(line);
    int fd = fileno(log->jsonl);
    off_t start = lseek(fd, 0, SEEK_END);
    ssize_t wrote = start < 0 ? -1 : write(fd, line, n);
    if (wrote == (ssize_t)n) return;
    int err = wrote < 0 ? errno : ENOSPC;  // short: the disk filled as it wrote
    if (start >= 0 && ftruncate(fd, start) != 0) err = errno;
    char why[128];
    struct statvfs fs;
    double free_mb = fstatvfs(fd, &fs) == 0 ? (double)fs.f_bavail * fs.f_frsize / 1048576.0 : 0;
    defer_user_error("metrics: %s writing %s (a record of %zu bytes, %.1f MB free): %s or set "
                     "job.dump_folder elsewhere", write_error_why(err, why, sizeof why),
                     log->jsonl_path, n, free_mb, write_error_remedy(err));
}

void metrics_open_tensorboard(MetricsLog *log, const Config *c, int rank, int64_t resumed_step) {
    char folder[8192 + 32];
    int n = snprintf(folder, sizeof folder, "%s/%s", c->job.dump_folder,
                     c->metrics.save_tb_folder);
    if (c->metrics.save_for_all_ranks)  // torchtitan's layout: a TensorBoard run per rank
        snprintf(folder + n, sizeof folder - n, "/rank_%d", rank);
    tb_open(&log->tb, folder, resumed_step + 1);
    snprintf(log->lr_tag, sizeof log->lr_tag, "lr/%s", c->optimizer.name);
    log_info("tensorboard: events in %s", log->tb.path);
}

// The step's figures under torchtitan's tags (torchtitan/components/metrics.py); memory is the
// kernels' memory_peak (torchtitan's memory/* tags are the device allocator's).
static void tensorboard_write(MetricsLog *log, const StepMetrics *m) {
    TbWriter *tb = &log->tb;
    tb_add_scalar(tb, "loss_metrics/global_avg_loss", m->step, m->loss);
    tb_add_scalar(tb, "grad_norm", m->step, m->grad_norm);
    tb_add_scalar(tb, log->lr_tag, m->step, m->lr);
    tb_add_scalar(tb, "throughput(tps)", m->step, m->tokens_per_s);
    tb_add_scalar(tb, "tflops", m->step, m->tflops);
    if (!isnan(m->mfu)) tb_add_scalar(tb, "mfu(%)", m->step, m->mfu);
    tb_add_scalar(tb, "memory/peak(GiB)", m->step, m->peak_memory_gib);
    if (m->expert_load_max > 0) {
        tb_add_scalar(tb, "moe/expert_load_max", m->step, m->expert_load_max);
        tb_add_scalar(tb, "moe/expert_load_mean", m->step, m->expert_load_mean);
    }
    if (!isnan(m->aux_loss)) tb_add_scalar(tb, "moe/aux_loss", m->step, m->aux_loss);
    tb_flush(tb);
}

// torchtitan's colors for the step line's fields, in order: step, loss, grad_norm, lr, tok/s,
// TFLOP/s, MFU, memory; then the reset.
static const char *const COLORS[] = {"\033[31m", "\033[32m", "\033[38;2;255;165;0m", "\033[37m",
                                     "\033[34m", "\033[36m", "\033[35m", "\033[33m", "\033[39m"};
#define N_COLORS (sizeof COLORS / sizeof COLORS[0])

void metrics_write(MetricsLog *log, const StepMetrics *m) {
    char mfu[32], mfu_json[32], load[128] = "", load_json[256] = "";
    bool known = !isnan(m->mfu);
    snprintf(mfu, sizeof mfu, known ? "%5.2f%%" : "  n/a", m->mfu);
    snprintf(mfu_json, sizeof mfu_json, known ? "%.17g" : "null", m->mfu);
    if (m->expert_load_max > 0) {
        snprintf(load, sizeof load, "  load max %.2f mean %.2f", m->expert_load_max,
                 m->expert_load_mean);
        snprintf(load_json, sizeof load_json,
                 ", \"expert_load_max\": %.17g, \"expert_load_mean\": %.17g", m->expert_load_max,
                 m->expert_load_mean);
    }
    if (!isnan(m->aux_loss)) {
        size_t n = strlen(load), nj = strlen(load_json);
        snprintf(load + n, sizeof load - n, "  aux_loss %.4g", m->aux_loss);
        snprintf(load_json + nj, sizeof load_json - nj, ", \"aux_loss\": %.17g", m->aux_loss);
    }
    if (m->precision) {
        size_t n = strlen(load), nj = strlen(load_json);
        snprintf(load + n, sizeof load - n, "  precision %s", m->precision);
        snprintf(load_json + nj, sizeof load_json - nj, ", \"precision\": \"%s\"", m->precision);
    }
    if (m->float8) {
        size_t n = strlen(load), nj = strlen(load_json);
        snprintf(load + n, sizeof load - n, "  float8 %s", m->float8);
        snprintf(load_json + nj, sizeof load_json - nj, ", \"float8\": \"%s\"", m->float8);
    }
    // The throughput in the model's unit: images for an image model, tokens otherwise.
    char rate[32], images_json[64] = "";
    if (m->images_per_s > 0) {
        snprintf(rate, sizeof rate, "img/s %9.1f", m->images_per_s);
        snprintf(images_json, sizeof images_json, ", \"images_per_s\": %.17g", m->images_per_s);
    } else {
        snprintf(rate, sizeof rate, "tok/s %9.0f", m->tokens_per_s);
    }
    const char *c[N_COLORS];
    for (size_t i = 0; i < N_COLORS; i++) c[i] = log->color ? COLORS[i] : "";
    log_info("%sstep %5d  %sloss %8.4f  %sgrad_norm %7.4f  %slr %.3e  %s%s  "
             "%sTFLOP/s %6.3f  %sMFU %s  %smem %.2f GiB%s%s",
             c[0], m->step, c[1], m->loss, c[2], m->grad_norm, c[3], m->lr, c[4], rate,
             c[5], m->tflops, c[6], mfu, c[7], m->peak_memory_gib, c[8], load);
    if (!log->jsonl) return;  // not a logging rank
    if (log->tb.file) tensorboard_write(log, m);
    char line[4096];
    int n = snprintf(line, sizeof line,
            "{\"step\": %d, \"loss\": %.17g, \"grad_norm\": %.17g, \"lr\": %.17g, "
            "\"tokens_per_s\": %.17g%s, \"tflops\": %.17g, \"mfu\": %s, "
            "\"peak_memory_gib\": %.17g%s}\n",
            m->step, m->loss, m->grad_norm, m->lr, m->tokens_per_s, images_json, m->tflops,
            mfu_json, m->peak_memory_gib, load_json);
    CHECK(n > 0 && (size_t)n < sizeof line);
    record_append(log, line);
}

void metrics_write_validation(MetricsLog *log, int step, double loss) {
    log_info("validate step %5d  loss %8.4f", step, loss);
    if (!log->jsonl) return;
    if (log->tb.file) {
        tb_add_scalar(&log->tb, "validation_metrics/loss", step, loss);
        tb_flush(&log->tb);
    }
    char line[128];
    snprintf(line, sizeof line, "{\"step\": %d, \"validation_loss\": %.17g}\n", step, loss);
    record_append(log, line);
}

void metrics_close(MetricsLog *log) {
    if (log->jsonl) fclose(log->jsonl);
    log->jsonl = NULL;
    tb_close(&log->tb);
}

