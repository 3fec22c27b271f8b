// The config's key table (core/config_keys.def) and what works on one key or walks them all:
// lookups and typo suggestions, reading a value from its text and showing it, where it came
// from, the defaults, --help-config. The YAML form is core/config_yaml.c's, the command line
// core/config_override.c's, the checks across keys core/config_check.c's.
#include "core/config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/config_impl.h"
#include "core/errors.h"

// The _Generic term makes a table line whose ConfigType disagrees with the field's C type fail
// to compile, so offset arithmetic can never write a double into an int64_t. Numbers must name
// their range, so no integer can outgrow the int the trainer keeps it in.
#define FIELD(sec, name, ctype)                 \
    #sec, #name,                                \
        offsetof(Config, sec.name) +            \
            0 * sizeof(char[_Generic(((Config *)0)->sec.name, ctype: 1)])
#define K_BOOL(sec, name) FIELD(sec, name, bool), CONFIG_BOOL
#define K_INT(sec, name, min_v, max_v) \
    FIELD(sec, name, int64_t), CONFIG_INT, .min = min_v, .max = max_v
#define K_FLOAT(sec, name, lo_v, hi_v) \
    FIELD(sec, name, double), CONFIG_FLOAT, .lo = lo_v, .hi = hi_v
#define K_STR(sec, name) FIELD(sec, name, char *), CONFIG_STRING
#define K_ENUM(sec, name) FIELD(sec, name, char *), CONFIG_ENUM
#define K_LIST(sec, name) FIELD(sec, name, StringList), CONFIG_STRING_LIST

#define WINDOW_MAX (INT32_MAX - 1)  // the loader reads seq_len + 1 tokens into an int count
#define LOOP_MAX (INT32_MAX - 1)    // `for (int step = 1; step <= steps; step++)` must end
#define TRACE_BUF_MAX (1 << 20)     // flight recorder entries (56 bytes each): 56 MiB per rank

static bool is_positive_int(const char *t);

// torchtitan's selective AC: every nth block, or "op" (per operator).
static bool ac_option_valid(const char *t) { return !strcmp(t, "op") || is_positive_int(t); }

// A numeric IPv4 or IPv6 address: a name would need a resolver, and could mean several.
static bool ip_address_valid(const char *t) {
    unsigned char address[16];
    return inet_pton(AF_INET, t, address) == 1 || inet_pton(AF_INET6, t, address) == 1;
}

static const char *const OPTIMIZERS[] = {"Adam", "AdamW", "Muon", NULL};
static const char *const MUON_LR_ADJUSTMENTS[] = {"original", "match_rms_adamw", NULL};
static const char *const OPTIMIZER_IMPLS[] = {"for-loop", "foreach", "fused", NULL};
static const char *const DECAY_TYPES[] = {"linear", "sqrt", "cosine", NULL};
static const char *const TRAIN_DTYPES[] = {"bfloat16", "float32", NULL};
static const char *const REDUCE_DTYPES[] = {"float32", "bfloat16", NULL};
static const char *const DEVICES[] = {"cpu", "cuda", NULL};
static const char *const EXPORT_DTYPES[] = {"float16", "bfloat16", "float32", NULL};
static const char *const RESHARD_POLICIES[] = {"default", "always", "never", NULL};
static const char *const PP_SCHEDULES[] = {"1F1B",          "GPipe",
                                           "Interleaved1F1B", "LoopedBFS",
                                           "InterleavedZeroBubble", "ZBVZeroBubble",
                                           "DualPipeV",     NULL};
static const char *const CP_ROTATE_METHODS[] = {"allgather", "alltoall", NULL};
static const char *const COMM_BACKENDS[] = {"auto", "nccl", "mpi", NULL};
static const char *const ASYNC_MODES[] = {"disabled", "async", "async_with_pinned_mem", NULL};
const char *const AC_MODES[] = {"none", "selective", "full", NULL};
static const char *const SEMI_SYNC_METHODS[] = {"none", "diloco", "streaming_diloco", NULL};
static const char *const FLOAT8_RECIPES[] = {"tensorwise", "rowwise", "rowwise_with_gw_hp", NULL};

// Every key, grouped by section in printing order: core/config_keys.def. Defaults are
// torchtitan's except where the help says otherwise.
#define KEY_BOOL(sec, name, ...) {K_BOOL(sec, name), __VA_ARGS__},
#define KEY_INT(sec, name, min_v, max_v, ...) {K_INT(sec, name, min_v, max_v), __VA_ARGS__},
#define KEY_FLOAT(sec, name, lo_v, hi_v, ...) {K_FLOAT(sec, name, lo_v, hi_v), __VA_ARGS__},
#define KEY_STR(sec, name, ...) {K_STR(sec, name), __VA_ARGS__},
#define KEY_ENUM(sec, name, ...) {K_ENUM(sec, name), __VA_ARGS__},
#define KEY_LIST(sec, name, ...) {K_LIST(sec, name), __VA_ARGS__},
const KeySpec KEYS[] = {
#include "core/config_keys.def"
};

// ---- field access --------------------------------------------------------------------------

static char *dup_range(const char *s, size_t n) {
    char *d = xmalloc(n + 1);
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

void string_set(char **dst, const char *value) {
    free(*dst);
    *dst = value ? dup_range(value, strlen(value)) : NULL;
}

void origin_set(Config *c, const KeySpec *s, const char *origin) {
    string_set(&c->origin[s - KEYS], origin);
}

void origin_of(const Config *c, const KeySpec *s, char *buf, size_t n) {
    const char *o = c->origin ? c->origin[s - KEYS] : NULL;
    snprintf(buf, n, "%s", o ? o : "default");
}

void list_clear(StringList *l) {
    for (int i = 0; i < l->count; i++) free(l->items[i]);
    free(l->items);
    l->count = 0;
    l->items = NULL;
}

void list_push(StringList *l, const char *s, size_t n) {
    char **items = realloc(l->items, (size_t)(l->count + 1) * sizeof *items);
    CHECK(items != NULL);
    l->items = items;
    l->items[l->count++] = dup_range(s, n);
}

// "a, b,,c" -> [a, b, c]: torchtitan's comma-separated form of a list on the command line.
static void list_split(StringList *l, const char *text) {
    const char *p = text;
    while (*p) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
        if (b > a) list_push(l, a, (size_t)(b - a));
        p = *end ? end + 1 : end;
    }
}

// ---- scalar text ---------------------------------------------------------------------------

bool is_null_word(const char *t) {
    return t[0] == '\0' || !strcmp(t, "~") || !strcasecmp(t, "null");
}

bool parse_bool(const char *t, bool *out) {
    static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
    for (size_t i = 0; i < 3; i++) {
        if (!strcasecmp(t, yes[i]) || !strcasecmp(t, no[i])) {
            *out = !strcasecmp(t, yes[i]);
            return true;
        }
    }
    return false;
}

// Length of the UTF-8 sequence at p and its code point; 0 when p holds no valid one (overlong
// forms, surrogates and code points past U+10FFFF are invalid, as for libyaml's reader).
size_t utf8_decode(const unsigned char *p, uint32_t *cp) {
    static const uint32_t min_of_len[] = {0, 0, 0x80, 0x800, 0x10000};
    size_t len = p[0] < 0x80 ? 1 : (p[0] >> 5) == 6 ? 2 : (p[0] >> 4) == 14 ? 3
                 : (p[0] >> 3) == 30 ? 4 : 0;
    if (len == 0) return 0;
    *cp = len == 1 ? p[0] : p[0] & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        *cp = (*cp << 6) | (p[i] & 0x3f);
    }
    bool valid = *cp >= min_of_len[len] && *cp <= 0x10ffff && (*cp < 0xd800 || *cp > 0xdfff);
    return valid ? len : 0;
}

// Text from the command line: a config file, printed as YAML, can hold only UTF-8.
static bool utf8_valid(const char *t) {
    uint32_t cp;
    for (const unsigned char *p = (const unsigned char *)t; *p;) {
        size_t len = utf8_decode(p, &cp);
        if (len == 0) return false;
        p += len;
    }
    return true;
}

typedef enum { INT_OK, INT_MALFORMED, INT_OUT_OF_RANGE } IntParse;

// Beyond int64, and the null sentinel itself, are out of every key's range: no value a user
// writes can read as null.
static IntParse parse_int(const char *t, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(t, &end, 10);
    if (end == t || *end != '\0') return INT_MALFORMED;
    if (errno == ERANGE || v == CONFIG_INT_UNSET) return INT_OUT_OF_RANGE;
    *out = (int64_t)v;
    return INT_OK;
}

static bool is_positive_int(const char *t) {
    int64_t v;
    return parse_int(t, &v) == INT_OK && v >= 1 && v <= INT32_MAX;
}

// Non-finite values are refused: NAN is how a nullable float says null.
static bool parse_float(const char *t, double *out) {
    char *end;
    double v = strtod(t, &end);
    if (end == t || *end != '\0' || !isfinite(v)) return false;
    *out = v;
    return true;
}

static bool int_in_range(const KeySpec *s, int64_t v) {
    return (s->minus_one_ok && v == -1) || (v >= s->min && v <= s->max);
}

static bool float_in_range(const KeySpec *s, double v) {
    return (s->lo_open ? v > s->lo : v >= s->lo) && (s->hi_open ? v < s->hi : v <= s->hi);
}

static bool enum_allows(const KeySpec *s, const char *t) {
    for (const char *const *v = s->choices; *v; v++)
        if (!strcmp(*v, t)) return true;
    return false;
}

// What a key accepts, in words; with_range adds a number's range ("an integer in [1, 8]").
void type_describe(const KeySpec *s, bool with_range, char *buf, size_t n) {
    static const char *const words[] = {"true or false", "an integer", "a number",
                                        "a string", NULL, "a list of strings"};
    size_t used = 0;
    if (s->type == CONFIG_INT && with_range)
        snprintf(buf, n, "%san integer in [%" PRId64 ", %" PRId64 "]",
                 s->minus_one_ok ? "-1 or " : "", s->min, s->max);
    else if (s->type == CONFIG_FLOAT && with_range && isinf(s->hi))
        snprintf(buf, n, "a number %s %g", s->lo_open ? ">" : ">=", s->lo);
    else if (s->type == CONFIG_FLOAT && with_range)
        snprintf(buf, n, "a number in %c%g, %g%c", s->lo_open ? '(' : '[', s->lo, s->hi,
                 s->hi_open ? ')' : ']');
    else if (s->type == CONFIG_STRING && s->expects)
        snprintf(buf, n, "%s", s->expects);
    else if (s->type != CONFIG_ENUM)
        snprintf(buf, n, "%s", words[s->type]);
    else
        for (const char *const *v = s->choices; *v && used < n; v++)
            used += (size_t)snprintf(buf + used, n - used, "%s %s",
                                     v == s->choices ? "one of" : ",", *v);
}

static bool set_null(Config *c, const KeySpec *s, char *why, size_t n) {
    if (!s->nullable) {
        snprintf(why, n, "cannot be null");
        return false;
    }
    void *f = field_of(c, s);
    if (s->type == CONFIG_INT) *(int64_t *)f = CONFIG_INT_UNSET;
    if (s->type == CONFIG_FLOAT) *(double *)f = NAN;
    if (s->type == CONFIG_STRING || s->type == CONFIG_ENUM) string_set(f, NULL);
    return true;
}

// A number's text into its field when it parses and lies in the key's range; *range_error
// says a well-formed number fell outside it.
static bool number_set(void *f, const KeySpec *s, const char *text, bool *range_error) {
    if (s->type == CONFIG_INT) {
        int64_t v;
        IntParse r = parse_int(text, &v);
        *range_error = r == INT_OUT_OF_RANGE || (r == INT_OK && !int_in_range(s, v));
        if (r == INT_OK && !*range_error) *(int64_t *)f = v;
        return r == INT_OK && !*range_error;
    }
    double v;
    bool parsed = parse_float(text, &v);
    *range_error = parsed && !float_in_range(s, v);
    if (parsed && !*range_error) *(double *)f = v;
    return parsed && !*range_error;
}

// Sets one key from its text form (a YAML scalar or a command-line value). On failure the
// field is untouched and why says what was expected.
bool value_set(Config *c, const KeySpec *s, const char *text, bool is_null, char *why,
               size_t n) {
    if (is_null) return set_null(c, s, why, n);
    char quoted[160];
    if (!utf8_valid(text)) {
        snprintf(why, n, "expects UTF-8 text, got %s", error_quote(quoted, sizeof quoted, text));
        return false;
    }
    void *f = field_of(c, s);
    bool ok = true, range_error = false;
    switch (s->type) {
    case CONFIG_BOOL: ok = parse_bool(text, f); break;
    case CONFIG_INT:
    case CONFIG_FLOAT: ok = number_set(f, s, text, &range_error); break;
    case CONFIG_ENUM:
    case CONFIG_STRING:
        ok = s->type == CONFIG_ENUM ? enum_allows(s, text) : !s->valid || s->valid(text);
        if (ok) string_set(f, text);
        break;
    case CONFIG_STRING_LIST:
        list_clear(f);
        list_split(f, text);
        break;
    }
    if (!ok) {
        char expected[256];
        type_describe(s, range_error, expected, sizeof expected);
        snprintf(why, n, "expects %s, got %s", expected, error_quote(quoted, sizeof quoted, text));
    }
    return ok;
}

// Shortest text that reads back as exactly v, so printed configs round-trip bit for bit.
static void format_double(double v, char *buf, size_t n) {
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, n, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
    if (!strpbrk(buf, ".e")) strncat(buf, ".0", n - strlen(buf) - 1);
}

// Plain text of a value, as messages show it and as the support table spells it.
void value_format(const Config *c, const KeySpec *s, char *buf, size_t n) {
    const void *f = field_of_const(c, s);
    switch (s->type) {
    case CONFIG_BOOL: snprintf(buf, n, "%s", *(const bool *)f ? "true" : "false"); break;
    case CONFIG_INT:
        if (*(const int64_t *)f == CONFIG_INT_UNSET) snprintf(buf, n, "null");
        else snprintf(buf, n, "%" PRId64, *(const int64_t *)f);
        break;
    case CONFIG_FLOAT:
        if (isnan(*(const double *)f)) snprintf(buf, n, "null");
        else format_double(*(const double *)f, buf, n);
        break;
    case CONFIG_STRING:
    case CONFIG_ENUM: snprintf(buf, n, "%s", *(char *const *)f ? *(char *const *)f : "null"); break;
    case CONFIG_STRING_LIST: {
        const StringList *l = f;
        size_t used = (size_t)snprintf(buf, n, "[");
        for (int i = 0; i < l->count && used < n; i++)
            used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? ", " : "", l->items[i]);
        if (used < n) snprintf(buf + used, n - used, "]");
        break;
    }
    }
}

// ---- lookup and suggestions ----------------------------------------------------------------

const KeySpec *spec_find(const char *section, size_t section_len, const char *key) {
    for (size_t i = 0; i < KEY_COUNT; i++)
        if (strlen(KEYS[i].section) == section_len &&
            !strncmp(KEYS[i].section, section, section_len) && !strcmp(KEYS[i].key, key))
            return &KEYS[i];
    return NULL;
}

const KeySpec *spec_find_full(const char *name) {
    const char *dot = strchr(name, '.');
    return dot ? spec_find(name, (size_t)(dot - name), dot + 1) : NULL;
}

// Index of the section's first key, or -1 for an unknown section.
int section_index(const char *name) {
    for (size_t i = 0; i < KEY_COUNT; i++)
        if (!strcmp(KEYS[i].section, name)) return (int)i;
    return -1;
}

bool section_starts_at(size_t i) {
    return i == 0 || strcmp(KEYS[i].section, KEYS[i - 1].section) != 0;
}

// Levenshtein distance; names longer than NAME_MAX_LEN are never close to anything.
static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b), row[NAME_MAX_LEN + 1];
    if (la > NAME_MAX_LEN || lb > NAME_MAX_LEN) return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static bool close_enough(size_t distance, const char *word) {
    return distance <= 2 + strlen(word) / 4;
}

// The known "section.key" nearest to a misspelt one; a key that exists verbatim in another
// section (training.lr -> optimizer.lr) counts as two edits away.
static const KeySpec *closest_key(const char *full) {
    const char *dot = strchr(full, '.');
    const KeySpec *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < KEY_COUNT; i++) {
        char name[2 * NAME_MAX_LEN];
        snprintf(name, sizeof name, "%s.%s", KEYS[i].section, KEYS[i].key);
        size_t d = edit_distance(full, name);
        if (dot && !strcmp(dot + 1, KEYS[i].key) && d > 2) d = 2;
        if (d < best_d) best = &KEYS[i], best_d = d;
    }
    return close_enough(best_d, full) ? best : NULL;
}

const char *closest_section(const char *name) {
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < KEY_COUNT; i++) {
        if (!section_starts_at(i)) continue;
        size_t d = edit_distance(name, KEYS[i].section);
        if (d < best_d) best = KEYS[i].section, best_d = d;
    }
    return close_enough(best_d, name) ? best : NULL;
}

const char *config_closest_name(const char *name, const char *const *names, size_t count) {
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < count; i++) {
        size_t d = edit_distance(name, names[i]);
        if (d < best_d) best = names[i], best_d = d;
    }
    return close_enough(best_d, name) ? best : NULL;
}

// " (did you mean 'PREFIXsection.key'?)" or "" when nothing is close.
void suggest_key(const char *full, const char *prefix, char *buf, size_t n) {
    const KeySpec *s = closest_key(full);
    if (s) snprintf(buf, n, " (did you mean '%s%s.%s'?)", prefix, s->section, s->key);
    else buf[0] = '\0';
}

// ---- defaults, lifetime --------------------------------------------------------------------

void config_defaults(Config *c) {
    memset(c, 0, sizeof *c);
    c->origin = xcalloc(KEY_COUNT, sizeof *c->origin);
    for (size_t i = 0; i < KEY_COUNT; i++) {
        const KeySpec *s = &KEYS[i];
        char why[512];
        if (!value_set(c, s, s->def ? s->def : "", s->def == NULL, why, sizeof why))
            die_internal(__FILE__, __LINE__, "default of %s.%s %s", s->section, s->key, why);
    }
}

void config_free(Config *c) {
    for (size_t i = 0; i < KEY_COUNT; i++) {
        void *f = field_of(c, &KEYS[i]);
        if (KEYS[i].type == CONFIG_STRING || KEYS[i].type == CONFIG_ENUM) string_set(f, NULL);
        if (KEYS[i].type == CONFIG_STRING_LIST) list_clear(f);
        if (c->origin) string_set(&c->origin[i], NULL);
    }
    free(c->origin);
    c->origin = NULL;
}

// ---- --help-config, origins, key info ------------------------------------------------------

// A key's default for --help-config: strings quoted, so that an empty one shows.
static void default_describe(const KeySpec *s, char *buf, size_t n) {
    bool text = s->type == CONFIG_STRING || s->type == CONFIG_ENUM;
    if (!s->def) snprintf(buf, n, "null");
    else if (s->type == CONFIG_STRING_LIST) snprintf(buf, n, "[%s]", s->def);
    else if (text) error_quote(buf, n, s->def);
    else snprintf(buf, n, "%s", s->def);
}

void config_print_help(FILE *f) {
    fputs("titan's config keys, named as torchtitan names them. Set them in the YAML file given "
          "to --config\n(a `section:` line, then `  key: value` lines) or on the command line "
          "(`--section.key value`\nor `--section.key=value`; a bare boolean flag means true). "
          "The command line wins.\n",
          f);
    for (size_t i = 0; i < KEY_COUNT; i++) {
        const KeySpec *s = &KEYS[i];
        char expects[256], def[128];
        type_describe(s, true, expects, sizeof expects);
        default_describe(s, def, sizeof def);
        if (section_starts_at(i)) fprintf(f, "\n%s:\n", s->section);
        fprintf(f, "  --%s.%s: %s%s; default %s\n      %s\n", s->section, s->key, expects,
                s->nullable ? " or null" : "", def, s->help);
    }
}

bool config_key_origin(const Config *c, const char *name, char *buf, size_t n) {
    const KeySpec *s = spec_find_full(name);
    if (s) origin_of(c, s, buf, n);
    return s != NULL;
}

bool config_value_text(const Config *c, const char *name, char *buf, size_t n) {
    const KeySpec *s = spec_find_full(name);
    if (s) value_format(c, s, buf, n);
    return s != NULL;
}

size_t config_key_count(void) { return KEY_COUNT; }

ConfigKeyInfo config_key_info(size_t i) {
    CHECK(i < KEY_COUNT);
    const KeySpec *s = &KEYS[i];
    bool is_int = s->type == CONFIG_INT;
    return (ConfigKeyInfo){.section = s->section, .key = s->key, .type = s->type,
                           .choices = s->choices, .lo = is_int ? (double)s->min : s->lo,
                           .hi = is_int ? (double)s->max : s->hi};
}

void config_load_or_die(Config *c, int argc, char **argv) {
    char err[1024];
    config_defaults(c);
    if (!config_parse_args(c, argc, argv, err, sizeof err) ||
        !config_check_supported(c, err, sizeof err))
        die_user("%s", err);
}
