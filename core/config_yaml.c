// The config as YAML: a file's keys read over a Config, with errors that name FILE:LINE:COL,
// and the resolved config printed back in a form that reads back the same.
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "core/config_impl.h"
#include "core/errors.h"
#include "core/files.h"

// ---- reading -------------------------------------------------------------------------------

typedef struct {
    Config *cfg;
    const char *path;  // escaped for messages
    yaml_document_t *doc;
    bool section_seen[KEY_COUNT];
    bool key_seen[KEY_COUNT];
    char *err;
    size_t errlen;
} FileParse;

__attribute__((format(printf, 3, 4))) static bool file_error(FileParse *p, yaml_mark_t m,
                                                              const char *fmt, ...) {
    int used = snprintf(p->err, p->errlen, "%s:%zu:%zu: ", p->path, m.line + 1, m.column + 1);
    if (used >= 0 && (size_t)used < p->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err + used, p->errlen - (size_t)used, fmt, ap);
        va_end(ap);
    }
    return false;
}

static const char *node_text(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

static bool node_is_null(const yaml_node_t *n) {
    return n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           is_null_word(node_text(n));
}

static bool node_to_list(FileParse *p, const yaml_node_t *seq, StringList *out, char *why,
                         size_t n) {
    for (yaml_node_item_t *it = seq->data.sequence.items.start; it < seq->data.sequence.items.top;
         it++) {
        const yaml_node_t *item = yaml_document_get_node(p->doc, *it);
        if (item->type != YAML_SCALAR_NODE) {
            snprintf(why, n, "expects a list of strings, got a nested %s",
                     item->type == YAML_MAPPING_NODE ? "mapping" : "list");
            return false;
        }
        list_push(out, node_text(item), item->data.scalar.length);
    }
    return true;
}

static bool node_apply(FileParse *p, const KeySpec *s, const yaml_node_t *v, char *why,
                       size_t n) {
    if (v->type == YAML_SCALAR_NODE) return value_set(p->cfg, s, node_text(v), node_is_null(v), why, n);
    if (v->type == YAML_SEQUENCE_NODE && s->type == CONFIG_STRING_LIST) {
        StringList items = {0, NULL};
        if (!node_to_list(p, v, &items, why, n)) {
            list_clear(&items);
            return false;
        }
        list_clear(field_of(p->cfg, s));
        *(StringList *)field_of(p->cfg, s) = items;
        return true;
    }
    char expected[256];
    type_describe(s, false, expected, sizeof expected);
    snprintf(why, n, "expects %s, got a %s", expected,
             v->type == YAML_MAPPING_NODE ? "mapping" : "list");
    return false;
}

static bool section_apply(FileParse *p, const char *section, const yaml_node_t *map) {
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top;
         pr++) {
        const yaml_node_t *k = yaml_document_get_node(p->doc, pr->key);
        const yaml_node_t *v = yaml_document_get_node(p->doc, pr->value);
        if (k->type != YAML_SCALAR_NODE)
            return file_error(p, k->start_mark, "keys of section '%s' must be names", section);
        char full[2 * NAME_MAX_LEN + 2], hint[3 * NAME_MAX_LEN], quoted[160];
        snprintf(full, sizeof full, "%s.%s", section, node_text(k));
        const KeySpec *s = spec_find(section, strlen(section), node_text(k));
        if (!s) {
            suggest_key(full, "", hint, sizeof hint);
            return file_error(p, k->start_mark, "unknown key %s%s",
                              error_quote(quoted, sizeof quoted, full), hint);
        }
        if (p->key_seen[s - KEYS]) return file_error(p, k->start_mark, "duplicate key '%s'", full);
        p->key_seen[s - KEYS] = true;
        char why[512];
        if (!node_apply(p, s, v, why, sizeof why))
            return file_error(p, v->start_mark, "%s %s", full, why);
        char origin[ORIGIN_MAX_LEN];
        snprintf(origin, sizeof origin, "%s:%zu:%zu", p->path, v->start_mark.line + 1,
                 v->start_mark.column + 1);
        origin_set(p->cfg, s, origin);
    }
    return true;
}

static bool document_apply(FileParse *p) {
    const yaml_node_t *root = yaml_document_get_root_node(p->doc);
    if (!root) return true;  // an empty file keeps every value
    if (root->type != YAML_MAPPING_NODE)
        return file_error(p, root->start_mark, "top level must be a mapping of sections");
    for (yaml_node_pair_t *pr = root->data.mapping.pairs.start; pr < root->data.mapping.pairs.top;
         pr++) {
        const yaml_node_t *k = yaml_document_get_node(p->doc, pr->key);
        const yaml_node_t *v = yaml_document_get_node(p->doc, pr->value);
        if (k->type != YAML_SCALAR_NODE)
            return file_error(p, k->start_mark, "section names must be plain names");
        const char *name = node_text(k);
        int idx = section_index(name);
        if (idx < 0) {
            const char *near = closest_section(name);
            char hint[NAME_MAX_LEN + 32] = "", quoted[160];
            if (near) snprintf(hint, sizeof hint, " (did you mean '%s'?)", near);
            return file_error(p, k->start_mark, "unknown section %s%s",
                              error_quote(quoted, sizeof quoted, name), hint);
        }
        if (p->section_seen[idx]) return file_error(p, k->start_mark, "duplicate section '%s'", name);
        p->section_seen[idx] = true;
        if (node_is_null(v)) continue;  // a section whose keys are all commented out
        if (v->type != YAML_MAPPING_NODE)
            return file_error(p, v->start_mark, "section '%s' must be a mapping of keys", name);
        if (!section_apply(p, name, v)) return false;
    }
    return true;
}

// libyaml's own problem text; its marks are 0-based.
static bool parser_error(FileParse *p, const yaml_parser_t *y) {
    if (y->error == YAML_READER_ERROR) {
        snprintf(p->err, p->errlen, "%s: %s (at byte %zu)", p->path, y->problem,
                 y->problem_offset);
        return false;
    }
    if (!y->problem) return file_error(p, y->problem_mark, "cannot parse YAML");
    if (!y->context) return file_error(p, y->problem_mark, "%s", y->problem);
    return file_error(p, y->problem_mark, "%s (%s at %zu:%zu)", y->problem, y->context,
                      y->context_mark.line + 1, y->context_mark.column + 1);
}

// A second document would silently be ignored, so it is an error.
static bool single_document(FileParse *p, yaml_parser_t *y) {
    yaml_document_t extra;
    if (!yaml_parser_load(y, &extra)) return parser_error(p, y);
    const yaml_node_t *root = yaml_document_get_root_node(&extra);
    bool ok = !root || file_error(p, root->start_mark, "only one YAML document is allowed");
    yaml_document_delete(&extra);
    return ok;
}

// Walks the text's events without building it, refusing it at the first collection deeper
// than CONFIG_MAX_DEPTH: libyaml builds a deep document in time quadratic in its depth.
static bool depth_check(FileParse *p, const char *text, size_t len) {
    yaml_parser_t y;
    CHECK(yaml_parser_initialize(&y));
    yaml_parser_set_input_string(&y, (const unsigned char *)text, len);
    bool ok = true, done = false;
    for (int depth = 0; ok && !done;) {
        yaml_event_t e;
        if (!yaml_parser_parse(&y, &e)) {
            ok = parser_error(p, &y);
            break;
        }
        bool opens = e.type == YAML_MAPPING_START_EVENT || e.type == YAML_SEQUENCE_START_EVENT;
        bool closes = e.type == YAML_MAPPING_END_EVENT || e.type == YAML_SEQUENCE_END_EVENT;
        depth += opens ? 1 : closes ? -1 : 0;
        if (depth > CONFIG_MAX_DEPTH)
            ok = file_error(p, e.start_mark,
                            "nested more than %d levels deep (a config is sections of keys, "
                            "whose values may be lists)", CONFIG_MAX_DEPTH);
        done = e.type == YAML_STREAM_END_EVENT;
        yaml_event_delete(&e);
    }
    yaml_parser_delete(&y);
    return ok;
}

bool config_parse_text(Config *c, const char *name, const char *text, size_t len, char *err,
                       size_t errlen) {
    char shown[PATH_SHOWN_MAX];
    error_escape(shown, sizeof shown, name);
    if (len > CONFIG_MAX_BYTES)
        return error_set(err, errlen, "%s: larger than the %d bytes a config may have", shown,
                         CONFIG_MAX_BYTES);
    yaml_document_t doc;
    FileParse p = {.cfg = c, .path = shown, .doc = &doc, .err = err, .errlen = errlen};
    if (!depth_check(&p, text, len)) return false;
    yaml_parser_t y;
    CHECK(yaml_parser_initialize(&y));
    yaml_parser_set_input_string(&y, (const unsigned char *)text, len);
    bool ok = yaml_parser_load(&y, &doc);
    if (!ok) {
        parser_error(&p, &y);
    } else {
        ok = document_apply(&p) && single_document(&p, &y);
        yaml_document_delete(&doc);
    }
    yaml_parser_delete(&y);
    return ok;
}

// A file past the size limit is refused as config_parse_text refuses such a text.
bool config_parse_file(Config *c, const char *path, char *err, size_t errlen) {
    char *text, shown[PATH_SHOWN_MAX], why[256];
    size_t len;
    FileReadResult r = file_read_all(path, CONFIG_MAX_BYTES, &text, &len);
    error_escape(shown, sizeof shown, path);
    if (r == FILE_TOO_LARGE)
        return error_set(err, errlen, "%s: larger than the %d bytes a config may have", shown,
                         CONFIG_MAX_BYTES);
    if (r == FILE_OPEN_FAILED || r == FILE_READ_FAILED)
        return error_set(err, errlen, "%s: cannot %s config file: %s", shown,
                         r == FILE_OPEN_FAILED ? "open" : "read", strerror(errno));
    if (r != FILE_READ_OK)
        return error_set(err, errlen, "%s: config file %s", shown,
                         file_read_why(r, CONFIG_MAX_BYTES, "a config", why, sizeof why));
    bool ok = config_parse_text(c, path, text, len, err, errlen);
    free(text);
    return ok;
}

// ---- printing ------------------------------------------------------------------------------

// YAML holds raw only printable code points, and reads NEL, LS and PS as line breaks.
static bool yaml_printable(uint32_t cp) {
    return cp == '\t' || (cp >= 0x20 && cp <= 0x7e) || (cp >= 0xa0 && cp <= 0xd7ff && cp) ||
           (cp >= 0xe000 && cp <= 0xfffd && cp != 0xfeff) || cp >= 0x10000;
}

// A double-quoted YAML scalar: the one string form that needs no case analysis to read back.
static void yaml_quote(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        uint32_t cp;
        size_t len = utf8_decode(p, &cp);
        if (len == 0) {  // not UTF-8: set in code, not read (the command line refuses it)
            fprintf(f, "\\x%02x", *p++);
            continue;
        }
        if (cp == '"' || cp == '\\') fprintf(f, "\\%c", (char)cp);
        else if (cp == '\n') fputs("\\n", f);
        else if (!yaml_printable(cp) || cp == 0x2028 || cp == 0x2029) fprintf(f, "\\u%04x", cp);
        else fwrite(p, 1, len, f);
        p += len;
    }
    fputc('"', f);
}

static void value_print_yaml(FILE *f, const Config *c, const KeySpec *s) {
    const void *v = field_of_const(c, s);
    if (s->type == CONFIG_STRING || s->type == CONFIG_ENUM) {
        if (*(char *const *)v) yaml_quote(f, *(char *const *)v);
        else fputs("null", f);
    } else if (s->type == CONFIG_STRING_LIST) {
        const StringList *l = v;
        fputc('[', f);
        for (int i = 0; i < l->count; i++) {
            if (i) fputs(", ", f);
            yaml_quote(f, l->items[i]);
        }
        fputc(']', f);
    } else {
        char text[64];
        value_format(c, s, text, sizeof text);
        fputs(text, f);
    }
}

void config_print_yaml(const Config *c, FILE *f) {
    for (size_t i = 0; i < KEY_COUNT; i++) {
        const KeySpec *s = &KEYS[i];
        if (section_starts_at(i)) fprintf(f, "%s%s:\n", i ? "\n" : "", s->section);
        fprintf(f, "  %s: ", s->key);
        value_print_yaml(f, c, s);
        fprintf(f, "  # %s\n", s->help);
    }
}

char *config_to_yaml(const Config *c) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    config_print_yaml(c, f);
    CHECK(fclose(f) == 0);
    return text;
}

// The first line where a and b differ, for a message.
static void line_first_difference(const char *a, const char *b, char *buf, size_t n) {
    size_t start = 0, i = 0;
    for (; a[i] && a[i] == b[i]; i++)
        if (a[i] == '\n') start = i + 1;
    char line[256];
    snprintf(line, sizeof line, "%.*s", (int)strcspn(a + start, "\n"), a + start);
    error_quote(buf, n, line);
}

bool config_roundtrip_check(const Config *c, char *err, size_t errlen) {
    char *text = config_to_yaml(c), why[1024];
    Config back;
    config_defaults(&back);
    bool ok = config_parse_text(&back, "<printed config>", text, strlen(text), why, sizeof why);
    if (!ok) {
        error_set(err, errlen, "the printed config does not parse: %s", why);
    } else {
        char *again = config_to_yaml(&back), line[300];
        ok = !strcmp(text, again);
        if (!ok) {
            line_first_difference(text, again, line, sizeof line);
            error_set(err, errlen, "the printed config reads back differently, at line %s", line);
        }
        free(again);
    }
    config_free(&back);
    free(text);
    return ok;
}
