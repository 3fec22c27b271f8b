// The subset of the Jinja2 template language that chat templates use (Hugging Face's
// `chat_template` in tokenizer_config.json), rendered as transformers renders them: Jinja2 with
// trim_blocks and lstrip_blocks, loop controls and the {% generation %} block of its
// AssistantTracker, and its globals raise_exception and namespace.
//
// Statements: if / elif / else, for (one or two names, a loop filter `if`, `else`, the `loop`
// object, break, continue), set (a name or a namespace's attribute), generation; comments and
// the whitespace controls `-` and `+`. Expressions: literals (strings, numbers, true / false /
// none, lists, dicts), names, `.attr`, `[index]`, `[a:b:c]`, calls, filters, `is` tests, the
// arithmetic, comparison, `in`, `~` and boolean operators and `a if b else c`. Filters: length,
// count, trim, tojson, string, lower, upper, capitalize, title, replace, default, join, first,
// last, list, reverse, items, int, float, abs, safe. Tests: defined, undefined, none, string,
// number, integer, float, boolean, true, false, mapping, sequence, iterable, even, odd,
// divisibleby, eq, ne. Methods: a string's startswith, endswith, strip, lstrip, rstrip, split,
// upper, lower, title, capitalize, replace, find; a dict's items, keys, values, get. Anything
// else (macros, includes, other filters, a filter's or method's arguments beyond those named
// here) is refused, naming the template's line and column. Where titan differs from Jinja2:
// integers are 64-bit (beyond, an error); upper/lower/title change ASCII letters only; a dict's
// attribute not called is its item before its method (`d.items` is d["items"] when d has one;
// `d.items()` is always the method); tuples are lists (and print as such).
//
// Values are JSON's (the variables come as a JSON object) plus undefined; each loop iteration
// and each {% generation %} block is a scope of its own, as in Jinja2.
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct Jinja Jinja;

// The template src[0, len), named `name` in messages; NULL and "name:LINE:COL: reason" in err.
Jinja *jinja_parse(const char *name, const char *src, size_t len, char *err, size_t errlen);
void jinja_free(Jinja *j);
// Whether the template marks the assistant's text with {% generation %} blocks.
bool jinja_has_generation(const Jinja *j);

// Output ranges [start[i], end[i]) written inside {% generation %} blocks.
typedef struct {
    size_t *start, *end;
    int n, cap;
} JinjaSpans;

// Renders with vars (a JSON object: its members are the template's variables; borrowed) and
// returns the malloc'd, NUL-terminated output (*len bytes), or NULL with "name:LINE:COL:
// reason" in err (raise_exception's message, an undefined value's attribute, a type error).
// spans (or NULL) receives the generation blocks' output; free it with jinja_spans_free.
char *jinja_render(const Jinja *j, const json_t *vars, size_t *len, JinjaSpans *spans,
                   char *err, size_t errlen);
void jinja_spans_free(JinjaSpans *s);
