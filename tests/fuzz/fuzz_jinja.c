// libFuzzer target: the chat-template interpreter (data/jinja.h). The input is a template, then
// optionally FUZZ_VARS_START and the JSON object of its variables. A template must parse or be
// refused in one line; a parsed one must render or be refused in one line, and render the
// same twice (its generation spans inside the output, in order).
#include <jansson.h>
#include <string.h>

#include "data/jinja.h"
#include "tests/fuzz/fuzz_file.h"

#define FUZZ_VARS_START "\n#vars\n"

static void one_line(const char *err) {
    if (!*err || strchr(err, '\n')) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[1024] = "";
    size_t head;
    const uint8_t *vars_text = fuzz_split(data, size, FUZZ_VARS_START, &head);
    Jinja *j = jinja_parse("fuzz", (const char *)data, head, err, sizeof err);
    if (!j) {
        one_line(err);
        return 0;
    }
    json_t *vars = vars_text ? json_loadb((const char *)vars_text, size - (size_t)(vars_text - data),
                                          0, NULL)
                             : NULL;
    size_t len[2];
    JinjaSpans spans[2];
    char *out[2];
    for (int k = 0; k < 2; k++) out[k] = jinja_render(j, vars, &len[k], &spans[k], err, sizeof err);
    if (!out[0] != !out[1]) abort();
    if (!out[0]) {
        one_line(err);
    } else {
        if (len[0] != len[1] || memcmp(out[0], out[1], len[0]) != 0 || spans[0].n != spans[1].n)
            abort();
        for (int s = 0; s < spans[0].n; s++)
            if (spans[0].start[s] >= spans[0].end[s] || spans[0].end[s] > len[0] ||
                (s > 0 && spans[0].start[s] < spans[0].end[s - 1]))
                abort();
        for (int k = 0; k < 2; k++) jinja_spans_free(&spans[k]), free(out[k]);
    }
    json_decref(vars);
    jinja_free(j);
    return 0;
}
