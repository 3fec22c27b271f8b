// What titan makes of conversations (data/chat.h), for tests/integration/test_chat.sh to compare
// with Jinja2's rendering and transformers' rules:
//   render_chat TOKENIZER FILE.jsonl
// prints one JSON object per line of FILE: {"text": the rendered conversation, "spans": [[start,
// end], ...] its trained byte ranges} or {"error": the one-line reason}; then one object
// {"ids": [...], "flags": [...]} holding the dataset's token stream as training reads it (ids
// and TOKEN_* bits), or the error line of that.
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/errors.h"
#include "data/chat.h"
#include "data/tokenize.h"

static void print(json_t *object) {
    char *s = json_dumps(object, JSON_COMPACT | JSON_ENSURE_ASCII);
    puts(s);
    free(s);
    json_decref(object);
}

int main(int argc, char **argv) {
    if (argc != 3) die_user("usage: render_chat TOKENIZER FILE.jsonl");
    Tokenizer *t = tokenizer_load(argv[1]);
    char err[1024];
    const json_t *specials;
    const Jinja *tmpl = tokenizer_chat_template(t, &specials, err, sizeof err);
    if (!tmpl) die_user("%s", err);
    FILE *f = fopen(argv[2], "r");
    if (!f) die_user("cannot read %s", argv[2]);
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t jerr;
        json_t *conv = json_loads(line, 0, &jerr);
        if (!conv) die_user("%s: %s", argv[2], jerr.text);
        ChatExample e;
        if (chat_render(tmpl, specials, conv, &e, err, sizeof err)) {
            json_t *spans = json_array();
            for (int k = 0; k < e.n; k++)
                json_array_append_new(spans, json_pack("[I, I]", (json_int_t)e.start[k],
                                                       (json_int_t)e.end[k]));
            print(json_pack("{s:s%, s:o}", "text", e.text, e.len, "spans", spans));
            chat_example_free(&e);
        } else {
            print(json_pack("{s:s}", "error", err));
        }
        json_decref(conv);
    }
    free(line);
    fclose(f);
    fflush(stdout);
    TokenStream s;
    token_stream_from_dataset(&s, argv[2], t);
    json_t *ids = json_array(), *flags = json_array();
    int64_t n = token_stream_num_tokens(&s);
    int32_t *window = xmalloc((size_t)n * sizeof(int32_t));
    token_stream_window(&s, 0, (int)n - 1, window);
    for (int64_t i = 0; i < n; i++) {
        json_array_append_new(ids, json_integer(window[i]));
        json_array_append_new(flags, json_integer(s.flags ? s.flags[i] : TOKEN_TRAINED));
    }
    print(json_pack("{s:o, s:o}", "ids", ids, "flags", flags));
    free(window);
    token_stream_close(&s);
    tokenizer_free(t);
    return 0;
}
