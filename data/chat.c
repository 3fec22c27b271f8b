#include "data/chat.h"

#include <stdlib.h>
#include <string.h>

#include "core/errors.h"

// The template's variables: the line's members, messages cut to its first `turns`, the
// tokenizer's special tokens and add_generation_prompt.
static json_t *chat_vars(const json_t *line, size_t turns, bool generation_prompt,
                         const char *bos, const char *eos) {
    json_t *vars = json_copy((json_t *)line), *messages = json_array();
    const json_t *all = json_object_get(line, "messages");
    for (size_t k = 0; k < turns; k++) json_array_append(messages, json_array_get(all, k));
    json_object_set_new(vars, "messages", messages);
    if (bos) json_object_set_new(vars, "bos_token", json_string(bos));
    if (eos) json_object_set_new(vars, "eos_token", json_string(eos));
    json_object_set_new(vars, "add_generation_prompt", json_boolean(generation_prompt));
    return vars;
}

static char *render(const Jinja *tmpl, const json_t *line, size_t turns, bool generation_prompt,
                    const char *bos, const char *eos, size_t *len, JinjaSpans *spans, char *err,
                    size_t errlen) {
    json_t *vars = chat_vars(line, turns, generation_prompt, bos, eos);
    char *text = jinja_render(tmpl, vars, len, spans, err, errlen);
    json_decref(vars);
    return text;
}

static void span_add(ChatExample *e, size_t start, size_t end) {
    e->start = realloc(e->start, (size_t)(e->n + 1) * sizeof(size_t));
    e->end = realloc(e->end, (size_t)(e->n + 1) * sizeof(size_t));
    CHECK(e->start && e->end);
    e->start[e->n] = start, e->end[e->n++] = end;
}

static bool is_prefix(const char *text, size_t len, const char *prefix, size_t n) {
    return n <= len && memcmp(text, prefix, n) == 0;
}

// Assistant turn i's span by the prefix rule (data/chat.h); false with a reason.
static bool turn_find(const Jinja *tmpl, const json_t *line, size_t i, const char *bos,
                      const char *eos, ChatExample *e, char *err, size_t errlen) {
    size_t before_len, upto_len;
    char *before = render(tmpl, line, i, true, bos, eos, &before_len, NULL, err, errlen);
    if (!before) return false;
    bool ok = is_prefix(e->text, e->len, before, before_len);
    free(before);
    if (!ok) {
        snprintf(err, errlen, "message %zu (assistant): the chat template renders the "
                 "conversation before it, with add_generation_prompt, other than the start of "
                 "the whole conversation; mark the assistant's text with {%% generation %%} "
                 "blocks in the template", i);
        return false;
    }
    const char *hit = NULL;
    if (eos && *eos) {
        hit = memmem(e->text + before_len, e->len - before_len, eos, strlen(eos));
        if (hit) {
            span_add(e, before_len, (size_t)(hit - e->text) + strlen(eos));
            return true;
        }
    }
    char *upto = render(tmpl, line, i + 1, false, bos, eos, &upto_len, NULL, err, errlen);
    if (!upto) return false;
    ok = is_prefix(e->text, e->len, upto, upto_len) && upto_len > before_len;
    free(upto);
    if (!ok) {
        snprintf(err, errlen, "message %zu (assistant): its end is neither the tokenizer's "
                 "eos_token nor where the conversation up to it, rendered alone, ends; mark the "
                 "assistant's text with {%% generation %%} blocks in the template", i);
        return false;
    }
    span_add(e, before_len, upto_len);
    return true;
}

bool chat_render(const Jinja *tmpl, const char *bos, const char *eos, const json_t *line,
                 ChatExample *out, char *err, size_t errlen) {
    *out = (ChatExample){0};
    const json_t *messages = json_object_get(line, "messages"), *m;
    size_t n = json_array_size(messages), i;
    if (!json_is_array(messages) || n == 0) {
        snprintf(err, errlen, "\"messages\" must be a non-empty array of {\"role\", \"content\"}");
        return false;
    }
    json_array_foreach(messages, i, m) {
        if (!json_is_string(json_object_get(m, "role"))) {
            snprintf(err, errlen, "message %zu has no \"role\" (a string)", i);
            return false;
        }
    }
    JinjaSpans spans;
    out->text = render(tmpl, line, n, false, bos, eos, &out->len, &spans, err, errlen);
    if (!out->text) return false;
    if (jinja_has_generation(tmpl)) {
        for (int k = 0; k < spans.n; k++) span_add(out, spans.start[k], spans.end[k]);
    } else {
        json_array_foreach(messages, i, m) {
            const char *role = json_string_value(json_object_get(m, "role"));
            if (strcmp(role, "assistant") == 0 && !turn_find(tmpl, line, i, bos, eos, out, err,
                                                             errlen)) {
                jinja_spans_free(&spans);
                chat_example_free(out);
                return false;
            }
        }
    }
    jinja_spans_free(&spans);
    bool ordered = true;
    for (int k = 1; k < out->n; k++) ordered = ordered && out->start[k] >= out->end[k - 1];
    if (out->n == 0 || !ordered) {
        snprintf(err, errlen, out->n ? "the chat template renders the assistant's turns out of "
                                       "order" : "the conversation has no assistant turn to "
                                                 "train on");
        chat_example_free(out);
        return false;
    }
    return true;
}

void chat_example_free(ChatExample *e) {
    free(e->text), free(e->start), free(e->end);
    *e = (ChatExample){0};
}
