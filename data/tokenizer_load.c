// Finding the format of a tokenizer path, the tiktoken rank-file loader and the built-in
// `bytes` vocabulary. The JSON formats (tokenizer.json, GPT-2) are in data/tokenizer_json.c.
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/errors.h"
#include "core/files.h"
#include "data/tokenizer_impl.h"

char *tokenizer_read_file(const char *path, size_t *len, char *err, size_t errlen) {
    char *text, why[256];
    FileReadResult r = file_read_all(path, TOKENIZER_MAX_BYTES, &text, len);
    if (r == FILE_OPEN_FAILED)
        return error_set(err, errlen, "tokenizer %s: %s", path, strerror(errno)), NULL;
    if (r != FILE_READ_OK)
        return error_set(err, errlen, "tokenizer %s %s", path,
                         file_read_why(r, TOKENIZER_MAX_BYTES, "a tokenizer", why, sizeof why)),
               NULL;
    return text;
}

void tokenizer_sibling_path(const char *path, const char *name, char *out, size_t outlen) {
    const char *slash = strrchr(path, '/');
    int dir = slash ? (int)(slash - path + 1) : 0;
    CHECK(snprintf(out, outlen, "%.*s%s", dir, path, name) < (int)outlen);
}

static int base64_value(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

// Decodes base64 (RFC 4648, '=' padded) in place: the output never outruns the input.
// Returns the decoded length, or -1 on a character or length outside the alphabet.
static long base64_decode(char *s, size_t n) {
    while (n > 0 && s[n - 1] == '=') n--;
    if (n % 4 == 1) return -1;
    uint32_t acc = 0;
    long out = 0;
    for (size_t i = 0; i < n; i++) {
        int v = base64_value(s[i]);
        if (v < 0) return -1;
        acc = acc << 6 | (uint32_t)v;
        if (i % 4 == 3)
            s[out++] = (char)(acc >> 16), s[out++] = (char)(acc >> 8), s[out++] = (char)acc;
    }
    if (n % 4 == 2) s[out++] = (char)(acc >> 4);
    if (n % 4 == 3) s[out++] = (char)(acc >> 10), s[out++] = (char)(acc >> 2);
    return out;
}

// One "<base64> <rank>" line, line[0, n) without its newline.
static bool tiktoken_parse_line(Tokenizer *t, char *line, size_t n, const char *path, int lineno,
                                char *err, size_t errlen) {
    char *space = memchr(line, ' ', n);
    char *end = line + n, *rank_end;
    long rank = space ? strtol(space + 1, &rank_end, 10) : -1;
    // Ranks stop short of TOKENIZER_MAX_IDS by room for the special tokens added after them.
    if (!space || space + 1 == end || rank_end != end || rank < 0 ||
        rank >= TOKENIZER_MAX_IDS - 512)
        return error_set(err, errlen, "tokenizer %s:%d: not a \"<base64> <rank>\" line", path,
                         lineno);
    // Ids index dense tables (an id without bytes cannot be decoded), so a rank file's ranks
    // must run 0, 1, 2, ... as tiktoken writes them: a gap or a repeat is a cut or corrupt file.
    if (rank != t->n_ids)
        return error_set(err, errlen,
                         "tokenizer %s:%d: rank %ld where %d was expected (ranks run 0, 1, 2, ... "
                         "in order, without gaps or repeats)",
                         path, lineno, rank, t->n_ids);
    long bytes = base64_decode(line, (size_t)(space - line));
    if (bytes <= 0)
        return error_set(err, errlen, "tokenizer %s:%d: %s", path, lineno,
                         bytes < 0 ? "bad base64" : "an empty token");
    if (!tokenizer_add_token(t, (int32_t)rank, line, (size_t)bytes, false))
        return error_set(err, errlen, "tokenizer %s:%d: the bytes of rank %ld repeat an earlier "
                         "rank's", path, lineno, rank);
    return true;
}

static bool tiktoken_parse(Tokenizer *t, char *text, size_t len, const char *path, char *err,
                           size_t errlen) {
    int lineno = 0;
    for (char *line = text, *end = text + len; line < end;) {
        char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol) eol = end;
        size_t n = (size_t)(eol - line);
        lineno++;
        if (n > 0 && line[n - 1] == '\r') n--;
        if (n > 0 && !tiktoken_parse_line(t, line, n, path, lineno, err, errlen)) return false;
        line = eol + 1;
    }
    return t->n_ids > 0 || error_set(err, errlen, "tokenizer %s: no ranks in it", path);
}

static void special_add(Tokenizer *t, int32_t id, const char *name) {
    CHECK(tokenizer_add_token(t, id, name, strlen(name), true));
}

// Meta's Llama 3 tokenizer.py (meta-llama/llama3, and torchtitan's copy): 256 special tokens
// after the 128000 ranks; 10 named ones, then the reserved tokens 5..250.
static void specials_add_llama3(Tokenizer *t) {
    static const char *const NAMED[] = {
        "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>", "<|reserved_special_token_2|>",
        "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
        "<|reserved_special_token_4|>", "<|eot_id|>"};
    const int n_named = (int)(sizeof NAMED / sizeof NAMED[0]);
    int32_t base = t->n_ids;
    for (int i = 0; i < 256; i++) {
        char name[64];
        snprintf(name, sizeof name, "<|reserved_special_token_%d|>", i - n_named + 5);
        special_add(t, base + i, i < n_named ? NAMED[i] : name);
    }
    t->bos = base, t->eos = base + 1;
}

// tiktoken's cl100k_base (openai_public.py): no BOS; <|endoftext|> ends documents.
static void specials_add_cl100k(Tokenizer *t) {
    special_add(t, 100257, "<|endoftext|>");
    special_add(t, 100258, "<|fim_prefix|>");
    special_add(t, 100259, "<|fim_middle|>");
    special_add(t, 100260, "<|fim_suffix|>");
    special_add(t, 100276, "<|endofprompt|>");
    t->eos = 100257;
}

// A rank file carries no special tokens, so they are known by the vocabulary's size: Llama 3
// (128000 ranks), cl100k (100256), else titan's own (`titan tokenizer train`): BOS and EOS
// right after the ranks.
static void specials_add_tiktoken(Tokenizer *t) {
    int32_t n = t->n_ids;
    if (n == 128000) {
        specials_add_llama3(t);
    } else if (n == 100256) {
        specials_add_cl100k(t);
    } else {
        special_add(t, n, "<|begin_of_text|>");
        special_add(t, n + 1, "<|end_of_text|>");
        t->bos = n, t->eos = n + 1;
    }
}

static Tokenizer *load_tiktoken(const char *path, char *text, size_t len, char *err,
                                size_t errlen) {
    Tokenizer *t = tokenizer_new("tiktoken");
    if (!tiktoken_parse(t, text, len, path, err, errlen)) return tokenizer_free(t), NULL;
    tokenizer_merges_from_ranks(t);
    specials_add_tiktoken(t);
    if (!tokenizer_finish(t, PRETOKENIZE_CL100K, path, err, errlen))
        return tokenizer_free(t), NULL;
    return t;
}

// 256 ids, the bytes themselves (ByT5-style); no merges, no specials.
static Tokenizer *load_bytes(void) {
    Tokenizer *t = tokenizer_new("bytes");
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        CHECK(tokenizer_add_token(t, b, &c, 1, false));
    }
    CHECK(tokenizer_finish(t, NULL, "bytes", NULL, 0));
    return t;
}

// A folder names its tokenizer by the conventional file names, the first found wins.
static bool folder_pick_file(const char *dir, char *out, size_t outlen, char *err,
                             size_t errlen) {
    static const char *const NAMES[] = {"encoder.json", "tokenizer.json", "tokenizer.model"};
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++) {
        CHECK(snprintf(out, outlen, "%s/%s", dir, NAMES[i]) < (int)outlen);
        if (access(out, R_OK) == 0) return true;
    }
    return error_set(err, errlen,
                     "tokenizer %s: a folder without encoder.json, tokenizer.json or "
                     "tokenizer.model",
                     dir);
}

static Tokenizer *load_file(const char *path, char *err, size_t errlen) {
    size_t len;
    char *text = tokenizer_read_file(path, &len, err, errlen);
    if (!text) return NULL;
    size_t skip = strspn(text, " \t\r\n");
    Tokenizer *t;
    if (text[skip] == '{') t = tokenizer_load_json(path, text, len, err, errlen);
    else if (strncmp(text, "#version", 8) == 0) t = tokenizer_load_gpt2_merges(path, err, errlen);
    else t = load_tiktoken(path, text, len, err, errlen);
    free(text);
    return t;
}

static int added_longest_first(const void *a, const void *b, void *t) {
    const int32_t *len = ((const Tokenizer *)t)->len;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return len[x] != len[y] ? (len[y] > len[x]) - (len[y] < len[x]) : (x > y) - (x < y);
}

// The template source of config's chat_template: a string, or the "default" entry of a list
// of {"name", "template"} (transformers' named templates); NULL (and why) otherwise.
static const char *config_chat_template(const json_t *config, const char **why) {
    const json_t *v = json_object_get(config, "chat_template"), *entry;
    size_t i;
    *why = "has no chat_template";
    if (json_is_string(v)) return json_string_value(v);
    json_array_foreach(v, i, entry) {
        const char *name = json_string_value(json_object_get(entry, "name"));
        if (name && strcmp(name, "default") == 0)
            return json_string_value(json_object_get(entry, "template"));
    }
    if (v) *why = "has a chat_template that is neither a string nor a list with a \"default\"";
    return NULL;
}

// transformers' special_tokens_map from tokenizer_config.json: each of its special-token keys
// set there (a string, or {"content": ...}), as text.
static json_t *config_specials(const json_t *config) {
    static const char *const KEYS[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                       "pad_token", "cls_token", "mask_token"};
    json_t *specials = json_object();
    for (size_t k = 0; k < sizeof KEYS / sizeof *KEYS; k++) {
        const json_t *v = json_object_get(config, KEYS[k]);
        const json_t *text = json_is_string(v) ? v : json_object_get(v, "content");
        if (json_is_string(text)) json_object_set(specials, KEYS[k], (json_t *)text);
    }
    return specials;
}

void tokenizer_chat_load(Tokenizer *t, const char *path) {
    if (t->n_added) qsort_r(t->added, t->n_added, sizeof(int32_t), added_longest_first, t);
    for (size_t k = 0; k < t->n_added; k++) {
        unsigned char first = (unsigned char)t->blob[t->start[t->added[k]]];
        t->added_first[first / 8] |= (uint8_t)(1u << (first % 8));
    }
    char jinja_path[PATH_MAX], config_path[PATH_MAX], err[PATH_MAX + 256];
    tokenizer_sibling_path(path, "chat_template.jinja", jinja_path, sizeof jinja_path);
    tokenizer_sibling_path(path, "tokenizer_config.json", config_path, sizeof config_path);
    size_t len;
    char *text = NULL;
    json_t *config = NULL;
    json_error_t jerr;
    bool have_jinja = access(jinja_path, R_OK) == 0, have_config = access(config_path, R_OK) == 0;
    if (have_config && !(config = json_load_file(config_path, JSON_DECODE_INT_AS_REAL, &jerr)))
        snprintf(err, sizeof err, "%s:%d:%d: %s", config_path, jerr.line, jerr.column, jerr.text);
    t->chat_specials = config_specials(config);
    if (have_jinja) {  // transformers reads it in place of the config's
        if ((text = tokenizer_read_file(jinja_path, &len, err, sizeof err)))
            t->chat = jinja_parse(jinja_path, text, len, err, sizeof err);
    } else if (config) {
        const char *why, *src = config_chat_template(config, &why);
        char name[PATH_MAX + 32];
        snprintf(name, sizeof name, "%s chat_template", config_path);
        if (src) t->chat = jinja_parse(name, src, strlen(src), err, sizeof err);
        else snprintf(err, sizeof err, "%s %s", config_path, why);
    } else if (!have_config) {
        snprintf(err, sizeof err, "there is no chat template beside tokenizer %s (its "
                 "tokenizer_config.json's chat_template, or chat_template.jinja)", path);
    }
    if (!t->chat) {
        t->chat_error = strdup(err);
        CHECK(t->chat_error);
    }
    free(text);
    json_decref(config);
}

Tokenizer *tokenizer_try_load(const char *path, char *err, size_t errlen) {
    if (strcmp(path, "bytes") == 0) return load_bytes();
    struct stat st;
    if (stat(path, &st) != 0)
        return error_set(err, errlen, "tokenizer %s: %s", path, strerror(errno)), NULL;
    char file[PATH_MAX];
    if (S_ISDIR(st.st_mode) && !folder_pick_file(path, file, sizeof file, err, errlen))
        return NULL;
    const char *chosen = S_ISDIR(st.st_mode) ? file : path;
    Tokenizer *t = load_file(chosen, err, errlen);
    if (t) tokenizer_chat_load(t, chosen);
    return t;
}

Tokenizer *tokenizer_load(const char *path) {
    char err[512];
    Tokenizer *t = tokenizer_try_load(path, err, sizeof err);
    if (!t) die_user("%s", err);
    return t;
}
