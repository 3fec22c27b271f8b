#include "data/chat.h"

#include <stdlib.h>
#include <string.h>

#include "core/errors.h"

// A conversation being rendered: its template, the tokenizer's special tokens and the JSONL
// line.
typedef struct {
    const Jinja *tmpl;
    const json_t *specials, *line;
    const char *eos;  // specials' eos_token; NULL: none
} Chat;

// The template's variables, as transformers' apply_chat_template passes them: the special
// tokens, messages (cut to the first `turns`), tools (the line's, else None), documents (None),
// add_generation_prompt and the line's chat_template_kwargs (TRL's column).
static json_t *chat_vars(const Chat *c, size_t turns, bool generation_prompt) {
    json_t *vars = json_copy((json_t *)c->specials), *messages = json_array();
    const json_t *all = json_object_get(c->line, "messages");
    for (size_t k = 0; k < turns; k++) json_array_append(messages, json_array_get(all, k));
    json_object_set_new(vars, "messages", messages);
    json_t *tools = json_object_get(c->line, "tools");
    json_object_set_new(vars, "tools", tools ? json_incref(tools) : json_null());
    json_object_set_new(vars, "documents", json_null());
    json_object_set_new(vars, "add_generation_prompt", json_boolean(generation_prompt));
    json_object_update(vars, json_object_get(c->line, "chat_template_kwargs"));
    return vars;
}

static char *render(const Chat *c, size_t turns, bool generation_prompt, size_t *len,
                    JinjaSpans *spans, char *err, size_t errlen) {
    json_t *vars = chat_vars(c, turns, generation_prompt);
    char *text = jinja_render(c->tmpl, vars, len, spans, err, errlen);
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
static bool turn_find(const Chat *c, size_t i, ChatExample *e, char *err, size_t errlen) {
    size_t before_len, upto_len;
    char *before = render(c, i, true, &before_len, NULL, err, errlen);
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
    if (c->eos && *c->eos) {
        hit = memmem(e->text + before_len, e->len - before_len, c->eos, strlen(c->eos));
        if (hit) {
            span_add(e, before_len, (size_t)(hit - e->text) + strlen(c->eos));
            return true;
        }
    }
    char *upto = render(c, i + 1, false, &upto_len, NULL, err, errlen);
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

bool chat_render(const Jinja *tmpl, const json_t *specials, const json_t *line,
                 ChatExample *out, char *err, size_t errlen) {
    *out = (ChatExample){0};
    Chat c = {tmpl, specials, line, json_string_value(json_object_get(specials, "eos_token"))};
    const json_t *kwargs = json_object_get(line, "chat_template_kwargs");
    if (kwargs && !json_is_object(kwargs)) {
        snprintf(err, errlen, "\"chat_template_kwargs\" must be an object");
        return false;
    }
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
    out->text = render(&c, n, false, &out->len, &spans, err, errlen);
    if (!out->text) return false;
    if (jinja_has_generation(tmpl)) {
        for (int k = 0; k < spans.n; k++) span_add(out, spans.start[k], spans.end[k]);
    } else {
        json_array_foreach(messages, i, m) {
            const char *role = json_string_value(json_object_get(m, "role"));
            if (strcmp(role, "assistant") == 0 && !turn_find(&c, i, out, err, errlen)) {
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

char *chat_render_prompt(const Jinja *tmpl, const json_t *specials, const json_t *line,
                         size_t *len, char *err, size_t errlen) {
    Chat c = {tmpl, specials, line, NULL};
    return render(&c, json_array_size(json_object_get(line, "messages")), true, len, NULL, err,
                  errlen);
}
