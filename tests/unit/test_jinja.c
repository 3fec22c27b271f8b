// The chat-template subset (data/jinja.h) on cases whose output is written out by hand from
// Jinja2's documented rules (test_chat checks whole templates against Jinja2 itself): the
// whitespace controls under trim_blocks and lstrip_blocks, scoping (a loop's `set` stays in its
// iteration, a namespace's attribute does not), {% generation %} spans, and errors that name the
// template's line and column, at parse time (syntax, anything outside the subset) or render
// time (an undefined value's attribute, raise_exception, a type error).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "data/jinja.h"

// The rendering of src with the JSON variables vars, or "ERROR: " and the message.
static char *render(const char *src, const char *vars, JinjaSpans *spans) {
    char err[512], *out;
    Jinja *j = jinja_parse("t", src, strlen(src), err, sizeof err);
    if (!j) {
        out = malloc(strlen(err) + 8);
        sprintf(out, "ERROR: %s", err);
        return out;
    }
    json_t *v = json_loads(vars, 0, NULL);
    assert_non_null(v);
    size_t len;
    out = jinja_render(j, v, &len, spans, err, sizeof err);
    if (out) assert_int_equal(strlen(out), len);
    else {
        out = malloc(strlen(err) + 8);
        sprintf(out, "ERROR: %s", err);
    }
    json_decref(v);
    jinja_free(j);
    return out;
}

static void expect(const char *src, const char *vars, const char *want) {
    char *got = render(src, vars, NULL);
    assert_string_equal(got, want);
    free(got);
}

static void test_whitespace_control(void **state) {
    (void)state;
    // trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before it.
    expect("a\n  {% if x %}\n  b\n  {% endif %}\nc\n", "{\"x\": true}", "a\n  b\nc");
    expect("a  {%- if x -%}  b  {%- endif %}", "{\"x\": 1}", "ab");
    expect("{{ 'a' }}\n{{- 'b' -}}\n  c", "{}", "abc");
    expect("  {%+ if true %}x{% endif %}", "{}", "  x");  // "+": no lstrip
    expect("x {# note #}\ny", "{}", "x y");  // not alone on its line: only the newline goes
    expect("  {# note #}\ny", "{}", "y");
    expect("a{{ 'b' }}\nc", "{}", "ab\nc");  // an output tag keeps its newline
}

static void test_expressions(void **state) {
    (void)state;
    expect("{{ messages|length - 1 }} {{ 'x' ~ (1 + 2) }} {{ not a is defined }}",
           "{\"messages\": [1, 2]}",
           "1 x3 True");
    expect("{{ [3, 1, 2][::-1] }} {{ 'abcdef'[1:5:2] }} {{ {'a': [1]}['a'][0] }}", "{}",
           "[2, 1, 3] bd 1");
    expect("{{ 7 // -2 }} {{ -7 % 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 1 if 0 else 2 }}", "{}",
           "-4 2 64 4 2");  // Jinja2: ** is left-associative, unary minus binds tighter
    expect("{{ 'a b'.split() }}|{{ 'xAx'.strip('x') }}|{{ ' y '|trim }}|{{ 'q'|tojson }}", "{}",
           "['a', 'b']|A|y|\"q\"");
    expect("{{ m.content is string }} {{ m.missing is defined }} {{ m.missing }}.",
           "{\"m\": {\"content\": \"c\"}}", "True False .");
    expect("{{ x|tojson }} {{ x|tojson(indent=1) }}", "{\"x\": {\"a\": [1, \"\\u00e9\"]}}",
           "{\"a\": [1, \"\u00e9\"]} {\n \"a\": [\n  1,\n  \"\u00e9\"\n ]\n}");
}

static void test_scoping(void **state) {
    (void)state;
    expect("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}", "{}", "1");
    // Every iteration starts afresh: what one sets, the next does not see.
    expect("{% for i in [1, 2] %}{% if i == 2 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}",
           "{}", "[]");
    expect("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}"
           "{% endfor %}{{ ns.x }}", "{}", "4");
    expect("{% for i in [1, 2, 3] if i != 2 %}{{ loop.index }}/{{ loop.length }}"
           "{% if loop.last %}.{% endif %}{% endfor %}", "{}", "1/22/2.");
    expect("{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}", "{\"d\": {\"a\": 1, \"b\": 2}}",
           "a1b2");
    // A call is a method's, even where the dict has an item of its name (a JSON schema's).
    expect("{% for k, v in d.items() %}{{ k }}{% endfor %}", "{\"d\": {\"items\": 1, \"get\": 2}}",
           "itemsget");
}

static void test_generation_spans(void **state) {
    (void)state;
    JinjaSpans spans;
    char *got = render("U{% generation %}A1{% endgeneration %}U{% generation %}{% endgeneration %}"
                       "{% generation %}A2{% endgeneration %}", "{}", &spans);
    assert_string_equal(got, "UA1UA2");
    assert_int_equal(spans.n, 2);  // the empty block marks nothing
    assert_int_equal(spans.start[0], 1), assert_int_equal(spans.end[0], 3);
    assert_int_equal(spans.start[1], 4), assert_int_equal(spans.end[1], 6);
    jinja_spans_free(&spans);
    free(got);
}

static void test_errors(void **state) {
    (void)state;
    expect("a\n{% if x %}b", "{}", "ERROR: t:2:12: the template ends inside a block: expected "
                                   "'{% endif %}'");
    expect("{{ x | map }}", "{}", "ERROR: t:1:6: filter 'map' is not in titan's chat-template "
                                  "subset");
    expect("{% include 'x' %}", "{}", "ERROR: t:1:4: '{% include %}' is not in titan's "
                                      "chat-template subset (data/jinja.h)");
    expect("{{ 'abc }}", "{}", "ERROR: t:1:4: unterminated string");
    expect("{% break %}", "{}", "ERROR: t:1:4: 'break' outside a for loop");
    expect("\n {{ a.b.c }}", "{\"a\": {}}", "ERROR: t:2:8: 'dict object' has no attribute 'b' "
                                             "is undefined");
    expect("{{ raise_exception('no system role') }}", "{}",
           "ERROR: t:1:19: the chat template raised: no system role");
    expect("{{ 'a' + 1 }}", "{}", "ERROR: t:1:8: unsupported operand types: string and integer");
    expect("{% set x.y = 1 %}", "{\"x\": {}}",
           "ERROR: t:1:4: cannot set an attribute of 'x': not a namespace()");
    // Integers are 64-bit: past them an error, never a wrap (nor a trap: LLONG_MIN // -1).
    expect("{{ (-9223372036854775807 - 1) // -1 }}", "{}",
           "ERROR: t:1:31: an integer beyond 64 bits");
    expect("{{ 2 ** 63 }}", "{}", "ERROR: t:1:6: an integer beyond 64 bits");
    expect("{{ 1 ** 99999999999999 }} {{ 1 % 9223372036854775807 }} {{ -7 % -3 }}", "{}",
           "1 1 -1");
    expect("{{ x | tojson(separators=(',', ':')) }}", "{\"x\": 1}",
           "ERROR: t:1:6: filter 'tojson': argument 'separators' is not in titan's chat-template "
           "subset");
    expect("{{ 'abc'.find('a', 1) }}", "{}", "ERROR: t:1:14: string method 'find' takes 1 "
                                             "positional argument in titan's chat-template "
                                             "subset");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whitespace_control),
        cmocka_unit_test(test_expressions),
        cmocka_unit_test(test_scoping),
        cmocka_unit_test(test_generation_spans),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
