// libFuzzer target: a pipeline schedule in torchtitan's CSV format, as
// parallelism.pipeline_parallel_schedule_csv is read (train/schedule.c): the text up to its
// first NUL (the trainer refuses a file with one), parsed, and, when its size is one a config
// can run (the trainer first requires its ranks and microbatches to be the config's), checked
// by the schedule checker, which plays every rank's list.
#include <stdlib.h>
#include <string.h>

#include "parallel/pp/schedule.h"
#include "tests/fuzz/fuzz_file.h"

#define CHECKED_MAX 64  // ranks, stages and microbatches of the schedules checked

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1), err[1200] = "";
    memcpy(text, data, size);
    text[size] = '\0';
    PpSchedule s;
    if (!pp_schedule_load_csv(&s, text, "fuzz.csv", err, sizeof err)) {
        fuzz_refusal_check(err);
        free(text);
        return 0;
    }
    free(text);
    if (s.ranks <= CHECKED_MAX && s.stages <= CHECKED_MAX && s.microbatches <= CHECKED_MAX) {
        PpReport r;
        err[0] = '\0';
        if (pp_schedule_check(&s, &r, err, sizeof err)) pp_report_free(&r);
        else fuzz_refusal_check(err);
    }
    pp_schedule_free(&s);
    return 0;
}
