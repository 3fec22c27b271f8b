// What the config's files share: the key table (core/config_keys.def: each key's index here,
// the KEYS table in config.c) and the helpers that find a key and read, set and show its value.
// config.c holds them; the YAML form is config_yaml.c's, the command line config_override.c's,
// the checks across keys config_check.c's. The rest of titan sees core/config.h only.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"

typedef struct {
    const char *section;
    const char *key;
    size_t offset;  // of the field inside Config
    ConfigType type;
    int64_t min, max;     // INT: accepted range, at most what the trainer's C type holds
    bool minus_one_ok;    // INT: -1 is a sentinel ("derive it", "all of it")
    double lo, hi;        // FLOAT: accepted range
    bool lo_open, hi_open;  // FLOAT: the bound itself is excluded
    bool (*valid)(const char *text);  // STRING: the values torchtitan accepts...
    const char *expects;              // ...in words
    const char *def;             // default, written as on the command line; NULL = null
    const char *const *choices;  // ENUM: allowed values, NULL-terminated
    bool nullable;               // torchtitan types it `X | None`
    const char *help;
} KeySpec;

// Each key's index in KEYS, KEY_section_key (a key listed twice fails to compile), and their
// count.
#define KEY_INDEX(sec, name, ...) KEY_##sec##_##name,
#define KEY_BOOL KEY_INDEX
#define KEY_INT KEY_INDEX
#define KEY_FLOAT KEY_INDEX
#define KEY_STR KEY_INDEX
#define KEY_ENUM KEY_INDEX
#define KEY_LIST KEY_INDEX
enum {
#include "core/config_keys.def"
    KEY_COUNT
};
#undef KEY_INDEX

extern const KeySpec KEYS[KEY_COUNT];

#define NAME_MAX_LEN 128  // no known name is this long, so longer input is simply unknown
#define PATH_SHOWN_MAX 512  // a config path as messages and origins show it
#define ORIGIN_MAX_LEN (PATH_SHOWN_MAX + 48)  // "PATH:LINE:COL" or "--section.key"

static inline void *field_of(Config *c, const KeySpec *s) { return (char *)c + s->offset; }

static inline const void *field_of_const(const Config *c, const KeySpec *s) {
    return (const char *)c + s->offset;
}

// ---- values (config.c) ---------------------------------------------------------------------

// *dst = a copy of value (NULL: none), freeing the old one.
void string_set(char **dst, const char *value);
// Where key s's value came from: a FILE:LINE:COL, "--section.key" or (unset) the default.
void origin_set(Config *c, const KeySpec *s, const char *origin);
void origin_of(const Config *c, const KeySpec *s, char *buf, size_t n);
void list_clear(StringList *l);
void list_push(StringList *l, const char *s, size_t n);  // a copy of s[0, n)
bool is_null_word(const char *t);  // "", "~" or null (any case)
bool parse_bool(const char *t, bool *out);  // true/yes/on, false/no/off (any case)
size_t utf8_decode(const unsigned char *p, uint32_t *cp);
void type_describe(const KeySpec *s, bool with_range, char *buf, size_t n);
bool value_set(Config *c, const KeySpec *s, const char *text, bool is_null, char *why,
               size_t n);
void value_format(const Config *c, const KeySpec *s, char *buf, size_t n);

// ---- lookup and suggestions (config.c) -----------------------------------------------------

const KeySpec *spec_find(const char *section, size_t section_len, const char *key);
const KeySpec *spec_find_full(const char *name);  // "section.key", or NULL
int section_index(const char *name);
bool section_starts_at(size_t i);
const char *closest_section(const char *name);
void suggest_key(const char *full, const char *prefix, char *buf, size_t n);
