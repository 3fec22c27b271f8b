// The command line: `--config PATH`, then `--section.key value` overrides in argument order.
#include <string.h>

#include "core/config_impl.h"
#include "core/errors.h"

static bool is_option(const char *arg) { return arg && !strncmp(arg, "--", 2); }

static bool is_config_flag(const char *name) {
    return !strcmp(name, "config") || !strcmp(name, "job.config_file");
}

// "--name=value" or "--name": copies name, points *value at the inline value or NULL.
static void option_split(const char *arg, char *name, size_t n, const char **value) {
    const char *eq = strchr(arg + 2, '=');
    size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
    snprintf(name, n, "%.*s", (int)len, arg + 2);
    *value = eq ? eq + 1 : NULL;
}

// The last --config / --job.config_file wins, as a later override would.
static bool args_find_config(int argc, char **argv, const char **path, char *err, size_t n) {
    for (int i = 1; i < argc; i++) {
        char name[NAME_MAX_LEN];
        const char *value;
        if (!is_option(argv[i])) continue;
        option_split(argv[i], name, sizeof name, &value);
        if (!is_config_flag(name)) continue;
        if (!value && (i + 1 >= argc || is_option(argv[i + 1]))) {
            snprintf(err, n, "--%s: expects a path", name);
            return false;
        }
        *path = value ? value : argv[i + 1];
    }
    return true;
}

// The value of option argv[*i] given as the next argument, which it then consumes. A BOOL
// takes the next argument only when it reads as true/false, so a bare flag means true.
static const char *option_next_value(const KeySpec *s, int argc, char **argv, int *i) {
    const char *next = *i + 1 < argc ? argv[*i + 1] : NULL;
    bool unused;
    bool takes = next && (s->type == CONFIG_BOOL ? parse_bool(next, &unused) : !is_option(next));
    if (takes) {
        (*i)++;
        return next;
    }
    return s->type == CONFIG_BOOL ? "true" : NULL;
}

static bool args_apply_overrides(Config *c, int argc, char **argv, char *err, size_t n) {
    for (int i = 1; i < argc; i++) {
        if (!is_option(argv[i])) {
            char quoted[160];
            return error_set(err, n, "unexpected argument %s",
                             error_quote(quoted, sizeof quoted, argv[i]));
        }
        char name[NAME_MAX_LEN], hint[3 * NAME_MAX_LEN], why[512], option[NAME_MAX_LEN + 2];
        const char *inline_v, *value;
        option_split(argv[i], name, sizeof name, &inline_v);
        if (is_config_flag(name)) {
            i += inline_v ? 0 : 1;  // args_find_config checked the path is there
            continue;
        }
        const KeySpec *s = spec_find_full(name);
        snprintf(option, sizeof option, "--%s", name);
        if (!s) {
            char quoted[2 * NAME_MAX_LEN];
            suggest_key(name, "--", hint, sizeof hint);
            return error_set(err, n, "unknown option %s%s",
                             error_quote(quoted, sizeof quoted, option), hint);
        }
        value = inline_v ? inline_v : option_next_value(s, argc, argv, &i);
        if (!value) {
            snprintf(err, n, "--%s: expects a value", name);
            return false;
        }
        if (!value_set(c, s, value, value[0] && is_null_word(value), why, sizeof why))
            return error_set(err, n, "%s: %s", option, why);
        origin_set(c, s, option);
    }
    return true;
}

bool config_parse_args(Config *c, int argc, char **argv, char *err, size_t errlen) {
    const char *path = NULL;
    if (!args_find_config(argc, argv, &path, err, errlen)) return false;
    if (path) {
        if (!config_parse_file(c, path, err, errlen)) return false;
        string_set(&c->job.config_file, path);
        origin_set(c, spec_find_full("job.config_file"), "--config");
    }
    return args_apply_overrides(c, argc, argv, err, errlen);
}
