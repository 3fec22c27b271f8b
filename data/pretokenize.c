#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/pretokenize.h"

#include <pcre2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "core/thread_exit.h"

struct Pretokenizer {
    pcre2_code *code;
    char *name;  // what the pattern came from, for the error line of a failed match
};

// Text the pattern is tried on once when made: a pattern that fails on it (a match limit as low
// as `(*LIMIT_MATCH=1)`) is refused where it is loaded rather than on the first document.
static const char PROBE[] =
    "Hello, world! It's 2024: x+y=42;\n\t  \xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87  \n";

// One match-data block per thread, sized for any of our patterns (they have one group).
static _Thread_local pcre2_match_data *thread_match_data;

static void match_data_free(void *data) { pcre2_match_data_free(data); }

static void match_error_message(int rc, char *out, size_t outlen) {
    PCRE2_UCHAR msg[256];
    if (pcre2_get_error_message(rc, msg, sizeof msg) < 0)
        snprintf((char *)msg, sizeof msg, "error %d", rc);
    snprintf(out, outlen, "%s", (char *)msg);
}

static void piece_ignore(const char *piece, size_t len, void *ctx) {
    (void)piece, (void)len, (void)ctx;
}

bool pretokenizer_try_create(Pretokenizer **out, const char *pattern, const char *name,
                             char *err, size_t errlen) {
    int code;
    PCRE2_SIZE offset;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &code, &offset,
                                   NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return error_set(err, errlen, "pre-tokenizer regex: %s at offset %zu", (char *)msg,
                         (size_t)offset);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if unavailable
    Pretokenizer *p = xmalloc(sizeof(Pretokenizer));
    *p = (Pretokenizer){re, strdup(name)};
    CHECK(p->name);
    int rc = pretokenizer_try_split(p, PROBE, sizeof PROBE - 1, piece_ignore, NULL);
    if (rc < 0) {
        char msg[256];
        match_error_message(rc, msg, sizeof msg);
        pretokenizer_free(p);
        return error_set(err, errlen, "pre-tokenizer regex fails to match: %s", msg);
    }
    *out = p;
    return true;
}

void pretokenizer_free(Pretokenizer *p) {
    if (!p) return;
    pcre2_code_free(p->code);
    free(p->name);
    free(p);
}

// Length of the UTF-8 sequence starting at s (1..4), or 0 if it is not a valid one
// (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
static size_t utf8_sequence(const unsigned char *s, size_t len) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
    if (n == 0 || c > 0xf4 || len < n) return 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (c == 0xe0 && s[1] < 0xa0) return 0;   // overlong 3-byte
    if (c == 0xed && s[1] >= 0xa0) return 0;  // surrogates
    if (c == 0xf0 && s[1] < 0x90) return 0;   // overlong 4-byte
    if (c == 0xf4 && s[1] >= 0x90) return 0;  // above U+10FFFF
    return n;
}

size_t utf8_valid_prefix(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t n = utf8_sequence(u + i, len - i);
        if (n == 0) break;
        i += n;
    }
    return i;
}

// Splits a run of valid UTF-8 with the regex; 0, or the PCRE2 error that stopped the match
// (a match or depth limit: never read as "no match", which would change the pieces).
static int split_valid(const Pretokenizer *p, const char *text, size_t len, PieceFn fn,
                       void *ctx) {
    if (!thread_match_data) {
        thread_match_data = pcre2_match_data_create(4, NULL);
        CHECK(thread_match_data);
        thread_exit_free(thread_match_data, match_data_free);
    }
    size_t at = 0;
    while (at < len) {
        int rc = pcre2_match(p->code, (PCRE2_SPTR)text, len, at, PCRE2_NO_UTF_CHECK,
                             thread_match_data, NULL);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) return rc;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(thread_match_data);
        if (rc < 0 || ov[1] == ov[0]) {  // no (or an empty) match: the rest is one piece
            fn(text + at, len - at, ctx);
            return 0;
        }
        if (ov[0] > at) fn(text + at, ov[0] - at, ctx);  // unmatched text is kept, not lost
        fn(text + ov[0], ov[1] - ov[0], ctx);
        at = ov[1];
    }
    return 0;
}

int pretokenizer_try_split(const Pretokenizer *p, const char *text, size_t len, PieceFn fn,
                           void *ctx) {
    size_t at = 0;
    while (at < len) {
        size_t valid = utf8_valid_prefix(text + at, len - at);
        int rc = split_valid(p, text + at, valid, fn, ctx);
        if (rc < 0) return rc;
        at += valid;
        if (at < len) fn(text + at++, 1, ctx);  // byte fallback for one invalid byte
    }
    return 0;
}

bool pretokenizer_split_error(const Pretokenizer *p, int rc, char *err, size_t errlen) {
    char msg[256];
    match_error_message(rc, msg, sizeof msg);
    return error_set(err, errlen, "%s: the pre-tokenizer regex fails to match a text: %s",
                     p->name, msg);
}

void pretokenizer_split(const Pretokenizer *p, const char *text, size_t len, PieceFn fn,
                        void *ctx) {
    int rc = pretokenizer_try_split(p, text, len, fn, ctx);
    if (rc < 0) {
        char err[512];
        pretokenizer_split_error(p, rc, err, sizeof err);
        die_user("%s", err);
    }
}
