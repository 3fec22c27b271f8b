// Jinja2's chat-template subset (data/jinja.h): a lexer that applies Jinja2's whitespace rules
// while it splits the source, a recursive-descent parser with Jinja2's operator precedence, and
// a tree-walking renderer over values held in one arena per render, so that an error (a
// longjmp out of any depth) frees everything with the arena.
#include "data/jinja.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"

// ---- arena ----

typedef struct Chunk {
    struct Chunk *next;
    size_t used, cap;
    max_align_t data[];
} Chunk;

typedef struct {
    Chunk *head;
} Arena;

static void *arena_alloc(Arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        Chunk *c = xmalloc(sizeof(Chunk) + cap);
        *c = (Chunk){.next = a->head, .cap = cap};
        a->head = c;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}

static void arena_free(Arena *a) {
    while (a->head) {
        Chunk *next = a->head->next;
        free(a->head);
        a->head = next;
    }
}

// ---- values ----

typedef struct {
    const char *s;
    size_t n;
} Str;

typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT } Kind;

typedef struct Value Value;
struct Value {
    Kind kind;
    bool ns;  // made by namespace(): its attributes may be set
    union {
        bool b;
        long long i;
        double f;
        Str str;  // V_STR; for V_UNDEF, what was looked up (for the error message)
        struct {
            Value **v;
            size_t n, cap;
        } list;
        struct {
            Str *key;
            Value **v;
            size_t n, cap;
        } dict;
    };
};

static bool str_eq(Str a, Str b) { return a.n == b.n && memcmp(a.s, b.s, a.n) == 0; }
static bool str_is(Str a, const char *s) { return str_eq(a, (Str){s, strlen(s)}); }

// ---- template structure ----

typedef enum { TK_TEXT, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END, TK_NAME,
               TK_INT, TK_FLOAT, TK_STRING, TK_OP, TK_EOF } TokKind;

typedef struct {
    TokKind kind;
    size_t pos;  // offset in the (newline-normalized) source
    Str s;       // text, name, string literal (unescaped) or operator
    long long i;
    double f;
} Tok;

typedef enum { N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_GEN, N_BREAK, N_CONTINUE, N_LIT, N_NAME,
               N_ATTR, N_INDEX, N_SLICE, N_CALL, N_FILTER, N_TEST, N_NOT, N_NEG, N_BIN,
               N_COMPARE, N_AND, N_OR, N_COND, N_LIST, N_DICT } NodeKind;

typedef enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CAT, OP_EQ,
               OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN } Op;

typedef struct Node Node;
struct Node {
    NodeKind kind;
    size_t pos;
    Str name, name2;  // name / attribute / filter / test; N_SET's attribute, N_FOR's 2nd name
    Value *lit;       // N_LIT, N_TEXT
    int op;           // N_BIN's Op; N_TEST: negated
    int *ops;         // N_COMPARE's operators (n - 1 of them)
    Node *a, *b, *c, *d;
    Node **items;     // a body's statements, a call's arguments, a list's items, a dict's k, v
    Str *keys;        // a call's keyword names (n == 0: positional)
    int n, cap;
};

struct Jinja {
    char *name, *src;  // src: newline-normalized
    size_t len;
    Arena arena;
    Node *body;
    bool generation;
};

static void line_col(const char *src, size_t pos, int *line, int *col) {
    *line = 1, *col = 1;
    for (size_t i = 0; i < pos; i++) {
        if (src[i] == '\n') ++*line, *col = 1;
        else if (((unsigned char)src[i] & 0xC0) != 0x80) ++*col;
    }
}

// "name:LINE:COL: message" in one line: control characters the message quotes (a string
// literal's, raise_exception's) become spaces.
static void error_at(char *err, size_t errlen, const Jinja *j, size_t pos, const char *fmt,
                     va_list ap) {
    int line, col;
    line_col(j->src, pos, &line, &col);
    int k = snprintf(err, errlen, "%s:%d:%d: ", j->name, line, col);
    if (k >= 0 && (size_t)k < errlen) vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
    for (char *c = err; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = ' ';
}

// ---- lexer ----

typedef struct {
    Jinja *j;
    Tok *toks;
    size_t n, cap, at;  // at: the parser's position
    int loops;          // for-loops around the statement being parsed
    jmp_buf fail;
    char *err;
    size_t errlen;
} Parser;

__attribute__((noreturn, format(printf, 3, 4)))
static void parse_fail(Parser *p, size_t pos, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_at(p->err, p->errlen, p->j, pos, fmt, ap);
    va_end(ap);
    longjmp(p->fail, 1);
}

static Tok *tok_push(Parser *p, TokKind kind, size_t pos) {
    p->toks = xgrow(p->toks, &p->cap, p->n + 1, sizeof(Tok));
    Tok *t = &p->toks[p->n++];
    *t = (Tok){.kind = kind, .pos = pos};
    return t;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' ||
                                      c == '\f' || c == '\v'; }
static bool is_name_start(char c) { return c == '_' || ((c | 32) >= 'a' && (c | 32) <= 'z'); }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static size_t utf8_put(char *out, uint32_t cp) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | (cp >> 6 & 63)),
               out[2] = (char)(0x80 | (cp & 63)), 3;
    return out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | (cp >> 12 & 63)),
           out[2] = (char)(0x80 | (cp >> 6 & 63)), out[3] = (char)(0x80 | (cp & 63)), 4;
}

// A string literal from its opening quote at s[*i]: Python's escapes, as Jinja2 reads them.
static Str lex_string(Parser *p, size_t *i) {
    const char *s = p->j->src;
    char quote = s[*i];
    size_t start = *i, k = *i + 1, end = k;
    while (end < p->j->len && s[end] != quote) end += s[end] == '\\' ? 2 : 1;
    if (end >= p->j->len) parse_fail(p, start, "unterminated string");
    char *out = arena_alloc(&p->j->arena, end - start + 1);  // escapes only shrink the text
    size_t n = 0;
    for (;; k++) {
        if (k >= p->j->len) parse_fail(p, start, "unterminated string");
        char c = s[k];
        if (c == quote) break;
        if (c != '\\') { out[n++] = c; continue; }
        if (++k >= p->j->len) parse_fail(p, start, "unterminated string");
        const char *simple = strchr("nrtabfv\\'\"", s[k]);
        if (simple && s[k]) {
            out[n++] = "\n\r\t\a\b\f\v\\'\""[simple - "nrtabfv\\'\""];
            continue;
        }
        if (s[k] >= '0' && s[k] <= '7') {  // octal, up to three digits
            unsigned v = 0;
            for (int d = 0; d < 3 && k < end && s[k] >= '0' && s[k] <= '7'; d++, k++)
                v = v * 8 + (unsigned)(s[k] - '0');
            k--;
            n += utf8_put(out + n, v);
            continue;
        }
        if (s[k] == 'N') parse_fail(p, k - 1, "\\N{...} escapes are not supported");
        int hex = s[k] == 'x' ? 2 : s[k] == 'u' ? 4 : s[k] == 'U' ? 8 : 0;
        if (!hex) { out[n++] = '\\', out[n++] = s[k]; continue; }  // kept, as Python does
        uint32_t cp = 0;
        for (int h = 0; h < hex; h++) {
            char d = k + 1 + h < p->j->len ? s[k + 1 + h] : 0;
            int v = is_digit(d) ? d - '0' : (d | 32) >= 'a' && (d | 32) <= 'f' ? (d | 32) - 'a' + 10
                                                                              : -1;
            if (v < 0) parse_fail(p, k - 1, "truncated \\%c escape", s[k]);
            cp = cp * 16 + (uint32_t)v;
        }
        if (cp > 0x10FFFF) parse_fail(p, k - 1, "escape beyond Unicode");
        k += (size_t)hex;
        n += utf8_put(out + n, cp);
    }
    *i = k + 1;
    return (Str){out, n};
}

static const char *const OPERATORS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/",
                                        "%", "~", "<", ">", "=", "(", ")", "[", "]", "{", "}",
                                        ",", ".", ":", "|"};

// The digits of base from s[*k] on, underscores between them (Python's literals), into out
// without the underscores; their count.
static size_t lex_digits(const char *s, size_t len, size_t *k, int base, char *out,
                         size_t *n) {
    size_t count = 0;
    for (; *k < len; ++*k) {
        char c = s[*k];
        int v = is_digit(c) ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10
                                                                           : 99;
        if (c == '_' && count > 0 && *k + 1 < len && s[*k + 1] != '_') continue;
        if (v >= base) break;
        if (*n < 63) out[(*n)++] = c;
        count++;
    }
    return count;
}

// A number literal from s[i]: an integer (0x, 0o and 0b prefixes too) or a float (a fraction
// needs a digit after the point, and a number right after "." is an integer: `messages.0`).
static size_t lex_number(Parser *p, size_t i) {
    const char *s = p->j->src;
    size_t len = p->j->len, k = i, n = 0;
    char text[64];
    int base = 10;
    if (s[i] == '0' && i + 1 < len && strchr("xXoObB", s[i + 1]) && s[i + 1]) {
        base = (s[i + 1] | 32) == 'x' ? 16 : (s[i + 1] | 32) == 'o' ? 8 : 2;
        k += 2;
        if (!lex_digits(s, len, &k, base, text, &n)) parse_fail(p, i, "a number without digits");
    } else {
        lex_digits(s, len, &k, 10, text, &n);
    }
    bool after_dot = p->n > 0 && p->toks[p->n - 1].kind == TK_OP &&
                     str_is(p->toks[p->n - 1].s, ".");
    bool real = false;
    if (base == 10 && !after_dot && k + 1 < len && s[k] == '.' && is_digit(s[k + 1])) {
        text[n++] = s[k++];
        lex_digits(s, len, &k, 10, text, &n);
        real = true;
    }
    if (base == 10 && !after_dot && k < len && (s[k] | 32) == 'e') {
        size_t e = k + 1;
        char sign = e < len && (s[e] == '+' || s[e] == '-') ? s[e++] : 0;
        if (e < len && is_digit(s[e]) && n < 60) {
            text[n++] = 'e';
            if (sign) text[n++] = sign;
            k = e;
            lex_digits(s, len, &k, 10, text, &n);
            real = true;
        }
    }
    if (n >= 63) parse_fail(p, i, "a number literal longer than 62 digits");
    text[n] = '\0';
    Tok *t = tok_push(p, real ? TK_FLOAT : TK_INT, i);
    errno = 0;
    if (real) t->f = strtod(text, NULL);
    else t->i = strtoll(text, NULL, base);
    if (errno == ERANGE && !real) parse_fail(p, i, "an integer beyond 64 bits");
    return k;
}

// The tokens of a tag from s[i], up to and including its close ("}}" or "%}" outside any
// bracket, optionally after "-" or, for "%}", "+"); returns the offset after the close and
// sets *strip when it was "-", *keep when "+" (no trim_blocks).
static size_t lex_tag(Parser *p, size_t i, const char *close, TokKind end, size_t open,
                      bool *strip, bool *keep) {
    const char *s = p->j->src;
    size_t len = p->j->len;
    int depth = 0;  // brackets open: a dict literal's "}}" closes nothing
    for (;;) {
        while (i < len && is_space(s[i])) i++;
        if (i >= len) parse_fail(p, open, "unclosed tag: no %s", close);
        *strip = depth == 0 && s[i] == '-' && strncmp(s + i + 1, close, 2) == 0;
        *keep = depth == 0 && close[0] == '%' && s[i] == '+' && strncmp(s + i + 1, close, 2) == 0;
        if (*strip || *keep || (depth == 0 && strncmp(s + i, close, 2) == 0)) {
            tok_push(p, end, i);
            return i + 2 + (*strip || *keep);
        }
        if (is_name_start(s[i])) {
            size_t k = i;
            while (k < len && (is_name_start(s[k]) || is_digit(s[k]))) k++;
            tok_push(p, TK_NAME, i)->s = (Str){s + i, k - i};
            i = k;
        } else if (is_digit(s[i])) {
            i = lex_number(p, i);
        } else if (s[i] == '\'' || s[i] == '"') {
            size_t at = i;
            Str str = lex_string(p, &i);
            tok_push(p, TK_STRING, at)->s = str;
        } else {
            size_t k = 0;
            for (; k < sizeof OPERATORS / sizeof *OPERATORS; k++)
                if (strncmp(s + i, OPERATORS[k], strlen(OPERATORS[k])) == 0) break;
            if (k == sizeof OPERATORS / sizeof *OPERATORS)
                parse_fail(p, i, "unexpected character '%c'", s[i]);
            tok_push(p, TK_OP, i)->s = (Str){OPERATORS[k], strlen(OPERATORS[k])};
            if (strchr("([{", s[i])) depth++;
            else if (strchr(")]}", s[i]) && depth > 0) depth--;
            i += strlen(OPERATORS[k]);
        }
    }
}

// Splits the source into text and tags with Jinja2's whitespace rules under trim_blocks and
// lstrip_blocks: "{%-" / "{{-" / "{#-" strip the whitespace before, "-%}" / "-}}" / "-#}" the
// whitespace after; a block or comment tag alone on its line loses the line's indentation
// (unless "{%+"), and the newline right after "%}" or "#}" is dropped.
static void lex(Parser *p) {
    const char *s = p->j->src;
    size_t len = p->j->len, pos = 0;
    bool line_starting = true, strip_next = false;
    while (pos <= len) {
        if (strip_next)
            while (pos < len && is_space(s[pos])) pos++;
        size_t i = pos;
        while (i + 1 < len && !(s[i] == '{' && strchr("{%#", s[i + 1]))) i++;
        bool tag = i + 1 < len;
        if (!tag) i = len;
        size_t text_end = i;
        char kind = tag ? s[i + 1] : 0, sign = tag && i + 2 < len ? s[i + 2] : 0;
        if (sign != '-' && sign != '+') sign = 0;
        if (tag && sign == '-') {
            while (text_end > pos && is_space(s[text_end - 1])) text_end--;
        } else if (tag && sign != '+' && kind != '{') {
            size_t line = text_end;
            while (line > pos && s[line - 1] != '\n') line--;
            bool blank = line < text_end;
            for (size_t k = line; k < text_end; k++) blank = blank && is_space(s[k]);
            if (blank && (line > pos || line_starting)) text_end = line;
        }
        if (text_end > pos) tok_push(p, TK_TEXT, pos)->s = (Str){s + pos, text_end - pos};
        if (!tag) break;
        size_t after, body = i + 2 + (sign != 0);
        bool strip, keep = false;
        if (kind == '#') {
            const char *end = strstr(s + body, "#}");
            if (!end) parse_fail(p, i, "unclosed comment");
            after = (size_t)(end - s) + 2;
            strip = end > s + body && end[-1] == '-';
        } else {
            tok_push(p, kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, i);
            after = lex_tag(p, body, kind == '{' ? "}}" : "%}",
                            kind == '{' ? TK_VAR_END : TK_BLOCK_END, i, &strip, &keep);
        }
        strip_next = strip;
        if (!strip && !keep && kind != '{' && after < len && s[after] == '\n') after++;  // trim
        line_starting = after > 0 && s[after - 1] == '\n';
        if (strip) {
            while (after < len && is_space(s[after])) after++;
            line_starting = s[after - 1] == '\n';
            strip_next = false;
        }
        pos = after;
    }
    tok_push(p, TK_EOF, len);
}

// ---- parser ----

static Tok *peek(Parser *p) { return &p->toks[p->at]; }
static Tok *advance(Parser *p) { return &p->toks[p->at++]; }
static bool is_op(Parser *p, const char *op) {
    return peek(p)->kind == TK_OP && str_is(peek(p)->s, op);
}
static bool is_name(Parser *p, const char *name) {
    return peek(p)->kind == TK_NAME && str_is(peek(p)->s, name);
}
static bool accept_op(Parser *p, const char *op) { return is_op(p, op) && advance(p); }
static bool accept_name(Parser *p, const char *name) { return is_name(p, name) && advance(p); }

static const char *tok_describe(const Tok *t, char *buf, size_t n) {
    switch (t->kind) {
    case TK_EOF: return "the end of the template";
    case TK_VAR_END: return "'}}'";
    case TK_BLOCK_END: return "'%}'";
    case TK_TEXT: return "text";
    default: snprintf(buf, n, "'%.*s'", (int)(t->s.n < 40 ? t->s.n : 40), t->s.s); return buf;
    }
}

static void expect_op(Parser *p, const char *op) {
    char buf[64];
    if (!accept_op(p, op))
        parse_fail(p, peek(p)->pos, "expected '%s', found %s", op,
                   tok_describe(peek(p), buf, sizeof buf));
}

static Str expect_name(Parser *p) {
    char buf[64];
    if (peek(p)->kind != TK_NAME)
        parse_fail(p, peek(p)->pos, "expected a name, found %s",
                   tok_describe(peek(p), buf, sizeof buf));
    return advance(p)->s;
}

static void expect_kind(Parser *p, TokKind kind, const char *what) {
    char buf[64];
    if (peek(p)->kind != kind)
        parse_fail(p, peek(p)->pos, "expected %s, found %s", what,
                   tok_describe(peek(p), buf, sizeof buf));
    advance(p);
}

static Node *node_new(Parser *p, NodeKind kind, size_t pos) {
    Node *n = arena_alloc(&p->j->arena, sizeof(Node));
    n->kind = kind, n->pos = pos;
    return n;
}

static void node_add(Parser *p, Node *n, Node *item, Str key) {
    if (n->n == n->cap) {  // doubling: the arena keeps every old array, in all twice the last
        n->cap = n->cap ? 2 * n->cap : 4;
        Node **items = arena_alloc(&p->j->arena, (size_t)n->cap * sizeof(Node *));
        Str *keys = arena_alloc(&p->j->arena, (size_t)n->cap * sizeof(Str));
        if (n->n) memcpy(items, n->items, (size_t)n->n * sizeof(Node *)),
                  memcpy(keys, n->keys, (size_t)n->n * sizeof(Str));
        n->items = items, n->keys = keys;
    }
    n->items[n->n] = item, n->keys[n->n++] = key;
}

static Value *value_new(Arena *a, Kind kind) {
    Value *v = arena_alloc(a, sizeof(Value));
    v->kind = kind;
    return v;
}

static Node *parse_expr(Parser *p, bool with_cond);

// Arguments of a call or filter after its "(": positional ones, then name=value ones.
static void parse_args(Parser *p, Node *call) {
    while (!accept_op(p, ")")) {
        if (call->n) expect_op(p, ",");
        if (accept_op(p, ")")) break;
        Str key = {0};
        if (peek(p)->kind == TK_NAME && p->toks[p->at + 1].kind == TK_OP &&
            str_is(p->toks[p->at + 1].s, "="))
            key = advance(p)->s, advance(p);
        node_add(p, call, parse_expr(p, true), key);
    }
}

static Node *literal(Parser *p, size_t pos, Kind kind) {
    Node *n = node_new(p, N_LIT, pos);
    n->lit = value_new(&p->j->arena, kind);
    return n;
}

static Node *parse_primary(Parser *p) {
    Tok *t = advance(p);
    char buf[64];
    Node *n;
    switch (t->kind) {
    case TK_NAME:
        if (str_is(t->s, "true") || str_is(t->s, "True") || str_is(t->s, "false") ||
            str_is(t->s, "False")) {
            n = literal(p, t->pos, V_BOOL);
            n->lit->b = (t->s.s[0] | 32) == 't';
        } else if (str_is(t->s, "none") || str_is(t->s, "None")) {
            n = literal(p, t->pos, V_NONE);
        } else {
            n = node_new(p, N_NAME, t->pos);
            n->name = t->s;
        }
        return n;
    case TK_STRING: {  // adjacent literals join, as in Python
        size_t total = t->s.n;
        for (size_t k = p->at; p->toks[k].kind == TK_STRING; k++) total += p->toks[k].s.n;
        char *s = arena_alloc(&p->j->arena, total + 1);
        size_t at = 0;
        for (Tok *u = t;; u = advance(p)) {
            memcpy(s + at, u->s.s, u->s.n), at += u->s.n;
            if (peek(p)->kind != TK_STRING) break;
        }
        n = literal(p, t->pos, V_STR);
        n->lit->str = (Str){s, total};
        return n;
    }
    case TK_INT: n = literal(p, t->pos, V_INT); n->lit->i = t->i; return n;
    case TK_FLOAT: n = literal(p, t->pos, V_FLOAT); n->lit->f = t->f; return n;
    case TK_OP:
        if (str_is(t->s, "(")) {
            n = parse_expr(p, true);
            if (is_op(p, ",")) {  // a tuple, held as a list
                Node *list = node_new(p, N_LIST, t->pos);
                node_add(p, list, n, (Str){0});
                while (accept_op(p, ",") && !is_op(p, ")"))
                    node_add(p, list, parse_expr(p, true), (Str){0});
                n = list;
            }
            expect_op(p, ")");
            return n;
        }
        if (str_is(t->s, "[")) {
            n = node_new(p, N_LIST, t->pos);
            while (!accept_op(p, "]")) {
                if (n->n) expect_op(p, ",");
                if (accept_op(p, "]")) break;
                node_add(p, n, parse_expr(p, true), (Str){0});
            }
            return n;
        }
        if (str_is(t->s, "{")) {
            n = node_new(p, N_DICT, t->pos);
            while (!accept_op(p, "}")) {
                if (n->n) expect_op(p, ",");
                if (accept_op(p, "}")) break;
                node_add(p, n, parse_expr(p, true), (Str){0});
                expect_op(p, ":");
                node_add(p, n, parse_expr(p, true), (Str){0});
            }
            return n;
        }
        break;
    default: break;
    }
    parse_fail(p, t->pos, "expected an expression, found %s", tok_describe(t, buf, sizeof buf));
}

static Node *parse_postfix(Parser *p, Node *n) {
    for (;;) {
        size_t pos = peek(p)->pos;
        if (accept_op(p, ".")) {
            if (peek(p)->kind == TK_INT) {  // `messages.0`: an item, as Jinja2 reads it
                Node *x = node_new(p, N_INDEX, pos);
                x->a = n, x->b = parse_primary(p);
                n = x;
                continue;
            }
            Node *a = node_new(p, N_ATTR, pos);
            a->a = n, a->name = expect_name(p);
            n = a;
        } else if (accept_op(p, "[")) {
            Node *bounds[3] = {0};
            int colons = 0;
            for (;;) {
                if (!is_op(p, ":") && !is_op(p, "]")) bounds[colons] = parse_expr(p, true);
                if (colons < 2 && accept_op(p, ":")) colons++;
                else break;
            }
            expect_op(p, "]");
            Node *x = node_new(p, colons ? N_SLICE : N_INDEX, pos);
            x->a = n, x->b = bounds[0], x->c = bounds[1], x->d = bounds[2];
            if (!colons && !x->b) parse_fail(p, pos, "empty subscript");
            n = x;
        } else if (accept_op(p, "(")) {
            Node *c = node_new(p, N_CALL, pos);
            c->a = n;
            parse_args(p, c);
            n = c;
        } else {
            return n;
        }
    }
}

static const char *const FILTERS[] = {"length", "count", "trim", "tojson", "string", "lower",
                                      "upper", "capitalize", "title", "replace", "default", "d",
                                      "join", "first", "last", "list", "reverse", "items", "int",
                                      "float", "abs", "safe"};
static const char *const TESTS[] = {"defined", "undefined", "none", "string", "number",
                                    "integer", "float", "boolean", "true", "false", "mapping",
                                    "sequence", "iterable", "even", "odd", "divisibleby", "eq",
                                    "equalto", "ne", "sameas"};

static bool listed(Str name, const char *const *names, size_t n) {
    for (size_t k = 0; k < n; k++)
        if (str_is(name, names[k])) return true;
    return false;
}

// Filters ("|name", "|name(args)") and tests ("is [not] name", "is name(args)", "is name
// literal"), which bind tighter than any operator.
static Node *parse_filters(Parser *p, Node *n) {
    for (;;) {
        size_t pos = peek(p)->pos;
        if (accept_op(p, "|")) {
            Node *f = node_new(p, N_FILTER, pos);
            f->a = n, f->name = expect_name(p);
            if (!listed(f->name, FILTERS, sizeof FILTERS / sizeof *FILTERS))
                parse_fail(p, pos, "filter '%.*s' is not in titan's chat-template subset",
                           (int)f->name.n, f->name.s);
            if (accept_op(p, "(")) parse_args(p, f);
            n = f;
        } else if (accept_name(p, "is")) {
            Node *t = node_new(p, N_TEST, pos);
            t->a = n, t->op = accept_name(p, "not");
            t->name = expect_name(p);
            if (!listed(t->name, TESTS, sizeof TESTS / sizeof *TESTS))
                parse_fail(p, pos, "test '%.*s' is not in titan's chat-template subset",
                           (int)t->name.n, t->name.s);
            // An argument in parentheses, or one without them: a literal, a name (not "else",
            // "or", "and") or a list or dict, as Jinja2's parse_test takes it.
            Tok *next = peek(p);
            if (accept_op(p, "(")) parse_args(p, t);
            else if (next->kind == TK_INT || next->kind == TK_FLOAT || next->kind == TK_STRING ||
                     (next->kind == TK_NAME && !is_name(p, "else") && !is_name(p, "or") &&
                      !is_name(p, "and")) ||
                     is_op(p, "[") || is_op(p, "{"))
                node_add(p, t, parse_postfix(p, parse_primary(p)), (Str){0});
            n = t;
        } else {
            return n;
        }
    }
}

static Node *parse_unary(Parser *p, bool with_filter) {
    size_t pos = peek(p)->pos;
    Node *n;
    if (accept_op(p, "-")) {
        n = node_new(p, N_NEG, pos);
        n->a = parse_unary(p, false);
    } else if (accept_op(p, "+")) {
        n = parse_unary(p, false);
    } else {
        n = parse_postfix(p, parse_primary(p));
    }
    return with_filter ? parse_filters(p, n) : n;
}

static Node *binary(Parser *p, size_t pos, Op op, Node *a, Node *b) {
    Node *n = node_new(p, N_BIN, pos);
    n->op = op, n->a = a, n->b = b;
    return n;
}

static Node *parse_pow(Parser *p) {
    Node *n = parse_unary(p, true);
    for (size_t pos = peek(p)->pos; accept_op(p, "**"); pos = peek(p)->pos)
        n = binary(p, pos, OP_POW, n, parse_unary(p, true));
    return n;
}

static Node *parse_math2(Parser *p) {
    Node *n = parse_pow(p);
    for (;;) {
        size_t pos = peek(p)->pos;
        Op op;
        if (accept_op(p, "*")) op = OP_MUL;
        else if (accept_op(p, "//")) op = OP_FLOORDIV;
        else if (accept_op(p, "/")) op = OP_DIV;
        else if (accept_op(p, "%")) op = OP_MOD;
        else return n;
        n = binary(p, pos, op, n, parse_pow(p));
    }
}

static Node *parse_concat(Parser *p) {
    Node *n = parse_math2(p);
    for (size_t pos = peek(p)->pos; accept_op(p, "~"); pos = peek(p)->pos)
        n = binary(p, pos, OP_CAT, n, parse_math2(p));
    return n;
}

static Node *parse_math1(Parser *p) {
    Node *n = parse_concat(p);
    for (;;) {
        size_t pos = peek(p)->pos;
        if (accept_op(p, "+")) n = binary(p, pos, OP_ADD, n, parse_concat(p));
        else if (accept_op(p, "-")) n = binary(p, pos, OP_SUB, n, parse_concat(p));
        else return n;
    }
}

// A comparison chain, as Python reads it: `a < b < c` is `a < b and b < c`, b evaluated once
// (N_COMPARE: its operands in items, each operator in ops).
static Node *parse_compare(Parser *p) {
    static const struct { const char *op; Op code; } COMPARE[] = {
        {"==", OP_EQ}, {"!=", OP_NE}, {"<=", OP_LE}, {">=", OP_GE}, {"<", OP_LT}, {">", OP_GT}};
    Node *first = parse_math1(p), *chain = NULL;
    for (;;) {
        size_t pos = peek(p)->pos;
        int k = 0;
        Op op;
        while (k < 6 && !is_op(p, COMPARE[k].op)) k++;
        if (k < 6) {
            advance(p);
            op = COMPARE[k].code;
        } else if (accept_name(p, "in")) {
            op = OP_IN;
        } else if (is_name(p, "not") && p->toks[p->at + 1].kind == TK_NAME &&
                   str_is(p->toks[p->at + 1].s, "in")) {
            p->at += 2;
            op = OP_NOTIN;
        } else {
            return chain ? chain : first;
        }
        if (!chain) {
            chain = node_new(p, N_COMPARE, pos);
            node_add(p, chain, first, (Str){0});
        }
        int *ops = arena_alloc(&p->j->arena, (size_t)chain->n * sizeof(int));
        if (chain->n > 1) memcpy(ops, chain->ops, (size_t)(chain->n - 1) * sizeof(int));
        ops[chain->n - 1] = op;
        chain->ops = ops;
        node_add(p, chain, parse_math1(p), (Str){0});
    }
}

static Node *parse_not(Parser *p) {
    size_t pos = peek(p)->pos;
    if (!accept_name(p, "not")) return parse_compare(p);
    Node *n = node_new(p, N_NOT, pos);
    n->a = parse_not(p);
    return n;
}

// A left-associative chain of `operand word operand ...` as nodes of kind (and, or).
static Node *parse_boolean(Parser *p, Node *(*operand)(Parser *), const char *word,
                           NodeKind kind) {
    Node *n = operand(p);
    for (size_t pos = peek(p)->pos; accept_name(p, word); pos = peek(p)->pos) {
        Node *b = node_new(p, kind, pos);
        b->a = n, b->b = operand(p);
        n = b;
    }
    return n;
}

static Node *parse_and(Parser *p) { return parse_boolean(p, parse_not, "and", N_AND); }
static Node *parse_or(Parser *p) { return parse_boolean(p, parse_and, "or", N_OR); }

// An expression; with_cond allows "a if b else c" (a for-loop's iterable does not, as its
// "if" is the loop filter).
static Node *parse_expr(Parser *p, bool with_cond) {
    Node *n = parse_or(p);
    while (with_cond && is_name(p, "if")) {
        Node *c = node_new(p, N_COND, advance(p)->pos);
        c->a = n, c->b = parse_or(p);
        if (accept_name(p, "else")) c->c = parse_expr(p, true);
        n = c;
    }
    return n;
}

static Node *parse_body(Parser *p, const char *const *ends, int n_ends, int *ended);

static Node *parse_if(Parser *p, size_t pos) {
    static const char *const ENDS[] = {"elif", "else", "endif"};
    Node *n = node_new(p, N_IF, pos);
    n->a = parse_expr(p, true);
    expect_kind(p, TK_BLOCK_END, "'%}'");
    int ended;
    n->b = parse_body(p, ENDS, 3, &ended);
    if (ended == 0) {
        n->c = parse_if(p, p->toks[p->at - 1].pos);
    } else if (ended == 1) {
        expect_kind(p, TK_BLOCK_END, "'%}'");
        n->c = parse_body(p, ENDS + 2, 1, &ended);
        expect_kind(p, TK_BLOCK_END, "'%}'");
    } else {
        expect_kind(p, TK_BLOCK_END, "'%}'");
    }
    return n;
}

static Node *parse_for(Parser *p, size_t pos) {
    static const char *const ENDS[] = {"else", "endfor"};
    Node *n = node_new(p, N_FOR, pos);
    n->name = expect_name(p);
    if (accept_op(p, ",")) n->name2 = expect_name(p);
    if (!accept_name(p, "in")) parse_fail(p, peek(p)->pos, "expected 'in'");
    n->a = parse_expr(p, false);
    if (accept_name(p, "if")) n->d = parse_expr(p, false);
    if (is_name(p, "recursive")) parse_fail(p, peek(p)->pos, "recursive loops are not supported");
    expect_kind(p, TK_BLOCK_END, "'%}'");
    int ended;
    p->loops++;
    n->b = parse_body(p, ENDS, 2, &ended);
    p->loops--;
    expect_kind(p, TK_BLOCK_END, "'%}'");
    if (ended == 0) {
        n->c = parse_body(p, ENDS + 1, 1, &ended);
        expect_kind(p, TK_BLOCK_END, "'%}'");
    }
    return n;
}

static Node *parse_statement(Parser *p) {
    Tok *t = peek(p);
    Str word = expect_name(p);
    Node *n;
    int ended;
    if (str_is(word, "if")) return parse_if(p, t->pos);
    if (str_is(word, "for")) return parse_for(p, t->pos);
    if (str_is(word, "set")) {
        n = node_new(p, N_SET, t->pos);
        n->name = expect_name(p);
        if (accept_op(p, ".")) n->name2 = expect_name(p);
        if (!is_op(p, "="))
            parse_fail(p, peek(p)->pos, "expected '=' (block assignments are not supported)");
        advance(p);
        n->a = parse_expr(p, true);
    } else if (str_is(word, "generation")) {
        static const char *const END[] = {"endgeneration"};
        expect_kind(p, TK_BLOCK_END, "'%}'");
        n = node_new(p, N_GEN, t->pos);
        int loops = p->loops;  // a call block (transformers' AssistantTracker): a function of
        p->loops = 0;          // its own, which no break or continue leaves
        n->b = parse_body(p, END, 1, &ended);
        p->loops = loops;
        p->j->generation = true;
    } else if (str_is(word, "break") || str_is(word, "continue")) {
        if (!p->loops) parse_fail(p, t->pos, "'%.*s' outside a for loop", (int)word.n, word.s);
        n = node_new(p, word.s[0] == 'b' ? N_BREAK : N_CONTINUE, t->pos);
    } else {
        parse_fail(p, t->pos, "'{%% %.*s %%}' is not in titan's chat-template subset "
                   "(data/jinja.h)", (int)word.n, word.s);
    }
    expect_kind(p, TK_BLOCK_END, "'%}'");
    return n;
}

// Statements until one of ends (its keyword consumed; *ended its index) or, with no ends, the
// end of the template. The body is a node list (N_LIST holding statements).
static Node *parse_body(Parser *p, const char *const *ends, int n_ends, int *ended) {
    Node *body = node_new(p, N_LIST, peek(p)->pos);
    for (;;) {
        Tok *t = peek(p);
        if (t->kind == TK_EOF) {
            if (n_ends) parse_fail(p, t->pos, "the template ends inside a block: expected "
                                   "'{%% %s %%}'", ends[n_ends - 1]);
            *ended = -1;
            return body;
        }
        advance(p);
        if (t->kind == TK_TEXT) {
            Node *n = node_new(p, N_TEXT, t->pos);
            n->lit = value_new(&p->j->arena, V_STR);
            n->lit->str = t->s;
            node_add(p, body, n, (Str){0});
        } else if (t->kind == TK_VAR_BEGIN) {
            Node *n = node_new(p, N_OUT, t->pos);
            n->a = parse_expr(p, true);
            expect_kind(p, TK_VAR_END, "'}}'");
            node_add(p, body, n, (Str){0});
        } else if (t->kind == TK_BLOCK_BEGIN) {
            for (int k = 0; k < n_ends; k++)
                if (accept_name(p, ends[k])) return *ended = k, body;
            node_add(p, body, parse_statement(p), (Str){0});
        } else {
            char buf[64];
            parse_fail(p, t->pos, "unexpected %s", tok_describe(t, buf, sizeof buf));
        }
    }
}

Jinja *jinja_parse(const char *name, const char *src, size_t len, char *err, size_t errlen) {
    Jinja *j = xcalloc(1, sizeof(Jinja));
    j->name = strdup(name);
    CHECK(j->name);
    // Jinja2 reads "\r\n" and "\r" as "\n" and drops one newline that ends the template.
    j->src = xmalloc(len + 1);
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r' && i + 1 < len && src[i + 1] == '\n') continue;
        j->src[j->len++] = src[i] == '\r' ? '\n' : src[i];
    }
    if (j->len && j->src[j->len - 1] == '\n') j->len--;
    j->src[j->len] = '\0';
    Parser p = {.j = j, .err = err, .errlen = errlen};
    if (setjmp(p.fail)) {
        free(p.toks);
        jinja_free(j);
        return NULL;
    }
    lex(&p);
    int ended;
    j->body = parse_body(&p, NULL, 0, &ended);
    free(p.toks);
    return j;
}

void jinja_free(Jinja *j) {
    if (!j) return;
    arena_free(&j->arena);
    free(j->name), free(j->src), free(j);
}

bool jinja_has_generation(const Jinja *j) { return j->generation; }

void jinja_spans_free(JinjaSpans *s) {
    free(s->start), free(s->end);
    *s = (JinjaSpans){0};
}

// ---- renderer ----

// Bounds far above any chat template's needs on any conversation, so that a template that
// loops or grows a string without end stops with an error.
#define RENDER_STEPS 50000000LL
#define RENDER_BYTES (256 << 20)

typedef struct Frame {
    Value *vars;  // a V_DICT
    struct Frame *up;
} Frame;

typedef struct {
    const Jinja *j;
    Arena arena;
    Frame *frame;
    char *out;
    size_t len, cap;
    JinjaSpans *spans;
    int control;  // 1: break, 2: continue, pending
    int generation;  // generation blocks open: a nested one marks nothing of its own
    long long steps;  // statements and expressions evaluated, against RENDER_STEPS
    jmp_buf fail;
    char *err;
    size_t errlen;
} Render;

__attribute__((noreturn, format(printf, 3, 4)))
static void fail(Render *r, const Node *at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_at(r->err, r->errlen, r->j, at->pos, fmt, ap);
    va_end(ap);
    longjmp(r->fail, 1);
}

static Value NONE = {.kind = V_NONE}, TRUE_ = {.kind = V_BOOL, .b = true},
             FALSE_ = {.kind = V_BOOL, .b = false};

static Value *boolean(bool b) { return b ? &TRUE_ : &FALSE_; }

static Value *undefined(Render *r, Str what) {
    Value *v = value_new(&r->arena, V_UNDEF);
    v->str = what;
    return v;
}

static Value *integer(Render *r, long long i) {
    Value *v = value_new(&r->arena, V_INT);
    v->i = i;
    return v;
}

static Value *real(Render *r, double f) {
    Value *v = value_new(&r->arena, V_FLOAT);
    v->f = f;
    return v;
}

static Value *string(Render *r, const char *s, size_t n) {
    Value *v = value_new(&r->arena, V_STR);
    v->str = (Str){s, n};
    return v;
}

static char *arena_dup(Render *r, const char *s, size_t n) {
    char *d = arena_alloc(&r->arena, n + 1);
    memcpy(d, s, n);
    return d;
}

static void list_push(Render *r, Value *list, Value *item) {
    if (list->list.n == list->list.cap) {
        size_t cap = list->list.cap ? 2 * list->list.cap : 8;
        Value **v = arena_alloc(&r->arena, cap * sizeof(Value *));
        if (list->list.n) memcpy(v, list->list.v, list->list.n * sizeof(Value *));
        list->list.v = v, list->list.cap = cap;
    }
    list->list.v[list->list.n++] = item;
}

static Value **dict_slot(Value *d, Str key) {
    for (size_t k = 0; k < d->dict.n; k++)
        if (str_eq(d->dict.key[k], key)) return &d->dict.v[k];
    return NULL;
}

static void dict_set(Render *r, Value *d, Str key, Value *v) {
    Value **slot = dict_slot(d, key);
    if (slot) { *slot = v; return; }
    if (d->dict.n == d->dict.cap) {
        size_t cap = d->dict.cap ? 2 * d->dict.cap : 8;
        Str *keys = arena_alloc(&r->arena, cap * sizeof(Str));
        Value **vals = arena_alloc(&r->arena, cap * sizeof(Value *));
        if (d->dict.n) memcpy(keys, d->dict.key, d->dict.n * sizeof(Str)),
                       memcpy(vals, d->dict.v, d->dict.n * sizeof(Value *));
        d->dict.key = keys, d->dict.v = vals, d->dict.cap = cap;
    }
    d->dict.key[d->dict.n] = key, d->dict.v[d->dict.n++] = v;
}

// The template's view of a JSON value (strings borrowed from it: vars outlive the render).
static Value *from_json(Render *r, const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_NULL: return &NONE;
    case JSON_TRUE: return &TRUE_;
    case JSON_FALSE: return &FALSE_;
    case JSON_INTEGER: return integer(r, json_integer_value(j));
    case JSON_REAL: return real(r, json_real_value(j));
    case JSON_STRING: return string(r, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        Value *v = value_new(&r->arena, V_LIST);
        size_t i;
        const json_t *item;
        json_array_foreach(j, i, item) list_push(r, v, from_json(r, item));
        return v;
    }
    case JSON_OBJECT: {
        Value *v = value_new(&r->arena, V_DICT);
        const char *key;
        const json_t *item;
        json_object_foreach((json_t *)j, key, item)
            dict_set(r, v, (Str){key, strlen(key)}, from_json(r, item));
        return v;
    }
    }
    return &NONE;
}

static bool truthy(const Value *v) {
    switch (v->kind) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: return v->b;
    case V_INT: return v->i != 0;
    case V_FLOAT: return v->f != 0;
    case V_STR: return v->str.n > 0;
    case V_LIST: return v->list.n > 0;
    case V_DICT: return v->dict.n > 0;
    }
    return false;
}

static const char *kind_name(const Value *v) {
    static const char *const NAMES[] = {"undefined", "none", "boolean", "integer", "float",
                                        "string", "list", "dict"};
    return NAMES[v->kind];
}

// ---- text of values: str() and repr() as Python writes them, JSON as json.dumps ----

typedef struct {
    char *s;
    size_t n, cap;
} Buf;

static void buf_put(Buf *b, const char *s, size_t n) {
    b->s = xgrow(b->s, &b->cap, b->n + n + 1, 1);
    memcpy(b->s + b->n, s, n);
    b->n += n;
}
static void buf_puts(Buf *b, const char *s) { buf_put(b, s, strlen(s)); }

// Python's repr of a float: the shortest digits that read back, positional for exponents
// from -4 to 15, else d.ddde+XX.
static void float_repr(Buf *b, double f) {
    if (isnan(f)) { buf_puts(b, "nan"); return; }
    if (isinf(f)) { buf_puts(b, f < 0 ? "-inf" : "inf"); return; }
    char e[40];
    for (int prec = 0; prec < 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec, f);
        if (strtod(e, NULL) == f) break;
    }
    char digits[24];
    size_t nd = 0;
    const char *c = e;
    bool negative = *c == '-';
    if (negative) c++;
    for (; *c != 'e'; c++)
        if (is_digit(*c)) digits[nd++] = *c;
    int exp = atoi(c + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char out[64];
    size_t n = 0;
    if (negative) out[n++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            n += (size_t)snprintf(out + n, sizeof out - n, "0.");
            for (int k = -1; k > exp; k--) out[n++] = '0';
            memcpy(out + n, digits, nd), n += nd;
        } else {
            for (int k = 0; k <= exp || k < (int)nd; k++) {
                if (k == exp + 1) out[n++] = '.';
                out[n++] = k < (int)nd ? digits[k] : '0';
            }
            if ((int)nd <= exp + 1) out[n++] = '.', out[n++] = '0';
        }
    } else {
        out[n++] = digits[0];
        if (nd > 1) out[n++] = '.', memcpy(out + n, digits + 1, nd - 1), n += nd - 1;
        n += (size_t)snprintf(out + n, sizeof out - n, "e%c%02d", exp < 0 ? '-' : '+',
                              exp < 0 ? -exp : exp);
    }
    buf_put(b, out, n);
}

static void value_repr(Buf *b, const Value *v);

// str(v): a string as itself, the rest as Python prints them.
static void value_str(Buf *b, const Value *v) {
    switch (v->kind) {
    case V_UNDEF: break;
    case V_STR: buf_put(b, v->str.s, v->str.n); break;
    default: value_repr(b, v); break;
    }
}

static void string_repr(Buf *b, Str s) {
    char quote = memchr(s.s, '\'', s.n) && !memchr(s.s, '"', s.n) ? '"' : '\'';
    buf_put(b, &quote, 1);
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.s[i];
        char esc[8];
        if (c == '\\' || c == (unsigned char)quote) snprintf(esc, sizeof esc, "\\%c", c);
        else if (c == '\n') strcpy(esc, "\\n");
        else if (c == '\r') strcpy(esc, "\\r");
        else if (c == '\t') strcpy(esc, "\\t");
        else if (c < 0x20 || c == 0x7f) snprintf(esc, sizeof esc, "\\x%02x", c);
        else esc[0] = (char)c, esc[1] = '\0';
        buf_puts(b, esc);
    }
    buf_put(b, &quote, 1);
}

static void value_repr(Buf *b, const Value *v) {
    char num[32];
    switch (v->kind) {
    case V_UNDEF: break;
    case V_NONE: buf_puts(b, "None"); break;
    case V_BOOL: buf_puts(b, v->b ? "True" : "False"); break;
    case V_INT: snprintf(num, sizeof num, "%lld", v->i); buf_puts(b, num); break;
    case V_FLOAT: float_repr(b, v->f); break;
    case V_STR: string_repr(b, v->str); break;
    case V_LIST:
        buf_puts(b, "[");
        for (size_t k = 0; k < v->list.n; k++) {
            if (k) buf_puts(b, ", ");
            value_repr(b, v->list.v[k]);
        }
        buf_puts(b, "]");
        break;
    case V_DICT:
        buf_puts(b, "{");
        for (size_t k = 0; k < v->dict.n; k++) {
            if (k) buf_puts(b, ", ");
            string_repr(b, v->dict.key[k]);
            buf_puts(b, ": ");
            value_repr(b, v->dict.v[k]);
        }
        buf_puts(b, "}");
        break;
    }
}

static void json_string_write(Buf *b, Str s) {
    buf_puts(b, "\"");
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.s[i];
        char esc[8];
        if (c == '"' || c == '\\') snprintf(esc, sizeof esc, "\\%c", c);
        else if (c == '\n') strcpy(esc, "\\n");
        else if (c == '\r') strcpy(esc, "\\r");
        else if (c == '\t') strcpy(esc, "\\t");
        else if (c == '\b') strcpy(esc, "\\b");
        else if (c == '\f') strcpy(esc, "\\f");
        else if (c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", c);
        else esc[0] = (char)c, esc[1] = '\0';
        buf_puts(b, esc);
    }
    buf_puts(b, "\"");
}

static void newline_indent(Buf *b, int indent, int depth) {
    buf_puts(b, "\n");
    for (int k = 0; k < indent * depth; k++) buf_puts(b, " ");
}

// json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: None), as transformers'
// tojson filter calls it.
static bool value_json(Buf *b, const Value *v, int indent, int depth) {
    const char *item_sep = indent < 0 ? ", " : ",";
    switch (v->kind) {
    case V_UNDEF: return false;
    case V_NONE: buf_puts(b, "null"); return true;
    case V_BOOL: buf_puts(b, v->b ? "true" : "false"); return true;
    case V_FLOAT:
        if (isnan(v->f)) buf_puts(b, "NaN");
        else if (isinf(v->f)) buf_puts(b, v->f < 0 ? "-Infinity" : "Infinity");
        else float_repr(b, v->f);
        return true;
    case V_INT: value_repr(b, v); return true;
    case V_STR: json_string_write(b, v->str); return true;
    case V_LIST:
    case V_DICT: {
        bool list = v->kind == V_LIST;
        size_t n = list ? v->list.n : v->dict.n;
        buf_puts(b, list ? "[" : "{");
        for (size_t k = 0; k < n; k++) {
            if (k) buf_puts(b, item_sep);
            if (indent >= 0) newline_indent(b, indent, depth + 1);
            if (!list) json_string_write(b, v->dict.key[k]), buf_puts(b, ": ");
            if (!value_json(b, list ? v->list.v[k] : v->dict.v[k], indent, depth + 1))
                return false;
        }
        if (indent >= 0 && n) newline_indent(b, indent, depth);
        buf_puts(b, list ? "]" : "}");
        return true;
    }
    }
    return false;
}

// A Buf's text moved into the arena as a string value.
static Value *buf_value(Render *r, Buf *b) {
    Value *v = string(r, arena_dup(r, b->s ? b->s : "", b->n), b->n);
    free(b->s);
    return v;
}

static Str to_str(Render *r, const Value *v) {
    if (v->kind == V_STR) return v->str;
    Buf b = {0};
    value_str(&b, v);
    return buf_value(r, &b)->str;
}

// ---- strings: code points, Python's whitespace ----

static uint32_t utf8_next(Str s, size_t *i) {
    unsigned char c = (unsigned char)s.s[*i];
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    uint32_t cp = extra ? c & (0x3F >> extra) : c;
    ++*i;
    for (int k = 0; k < extra && *i < s.n; k++) cp = cp << 6 | ((unsigned char)s.s[(*i)++] & 63);
    return cp;
}

// The byte offsets of s's code points, and its end: (*n + 1) entries in the arena.
static size_t *code_points(Render *r, Str s, size_t *n) {
    size_t *at = arena_alloc(&r->arena, (s.n + 1) * sizeof(size_t));
    size_t k = 0;
    for (size_t i = 0; i < s.n;) at[k++] = i, utf8_next(s, &i);
    at[k] = s.n;
    *n = k;
    return at;
}

static bool python_space(uint32_t c) {  // str.isspace
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

static bool in_chars(uint32_t c, const Str *chars) {
    if (!chars) return python_space(c);
    for (size_t i = 0; i < chars->n;)
        if (utf8_next(*chars, &i) == c) return true;
    return false;
}

// str.strip / lstrip / rstrip (chars NULL: whitespace).
static Str str_strip(Render *r, Str s, const Str *chars, bool left, bool right) {
    size_t n, *at = code_points(r, s, &n), lo = 0, hi = n;
    while (left && lo < hi) {
        size_t i = at[lo];
        if (!in_chars(utf8_next(s, &i), chars)) break;
        lo++;
    }
    while (right && hi > lo) {
        size_t i = at[hi - 1];
        if (!in_chars(utf8_next(s, &i), chars)) break;
        hi--;
    }
    return (Str){s.s + at[lo], at[hi] - at[lo]};
}

static const char *str_find(Str hay, Str needle, size_t from) {
    if (needle.n == 0) return hay.s + from;
    for (size_t i = from; i + needle.n <= hay.n; i++)
        if (memcmp(hay.s + i, needle.s, needle.n) == 0) return hay.s + i;
    return NULL;
}

// str.split(sep, maxsplit) (sep NULL: runs of whitespace, no empty pieces).
static Value *str_split(Render *r, Str s, const Str *sep, long long max, const Node *at) {
    Value *out = value_new(&r->arena, V_LIST);
    if (sep && sep->n == 0) fail(r, at, "split: empty separator");
    size_t i = 0;
    if (!sep) {
        for (;;) {
            while (i < s.n) {
                size_t k = i;
                if (!python_space(utf8_next(s, &k))) break;
                i = k;
            }
            if (i >= s.n) break;
            size_t start = i;
            if (max >= 0 && (long long)out->list.n == max) {  // the rest, as it is
                list_push(r, out, string(r, s.s + i, s.n - i));
                break;
            }
            while (i < s.n) {
                size_t k = i;
                if (python_space(utf8_next(s, &k))) break;
                i = k;
            }
            list_push(r, out, string(r, s.s + start, i - start));
        }
        return out;
    }
    for (;;) {
        const char *hit = max >= 0 && (long long)out->list.n == max ? NULL : str_find(s, *sep, i);
        size_t end = hit ? (size_t)(hit - s.s) : s.n;
        list_push(r, out, string(r, s.s + i, end - i));
        if (!hit) return out;
        i = end + sep->n;
    }
}

// ASCII letters only (other characters are kept as they are). Modes: 0 lower, 1 upper, 2
// capitalize, 3 Python's str.title (a word starts after any non-letter), 4 Jinja2's title
// filter (a word starts after whitespace or one of -({[<).
static Str str_case(Render *r, Str s, int mode) {
    char *d = arena_dup(r, s.s, s.n);
    bool word_start = true;
    for (size_t i = 0; i < s.n; i++) {
        char c = d[i];
        bool letter = (c | 32) >= 'a' && (c | 32) <= 'z';
        bool up = mode == 1 || (mode == 2 && i == 0) || (mode >= 3 && word_start);
        if (letter) d[i] = up ? (char)(c & ~32) : (char)(c | 32);
        word_start = mode == 3 ? !letter && !((unsigned char)c & 0x80)
                               : is_space(c) || (c && strchr("-({[<", c));
    }
    return (Str){d, s.n};
}

static Str str_replace(Render *r, Str s, Str old, Str new, long long count) {
    Buf b = {0};
    size_t i = 0;
    for (long long done = 0; count < 0 || done < count; done++) {
        const char *hit = str_find(s, old, i);
        if (!hit || (old.n == 0 && i > s.n)) break;
        size_t at = (size_t)(hit - s.s);
        buf_put(&b, s.s + i, at - i);
        buf_put(&b, new.s, new.n);
        if (old.n == 0) {  // Python inserts between every character
            if (at >= s.n) { i = s.n + 1; break; }
            size_t k = at;
            utf8_next(s, &k);
            buf_put(&b, s.s + at, k - at);
            i = k;
        } else {
            i = at + old.n;
        }
    }
    if (i < s.n) buf_put(&b, s.s + i, s.n - i);
    return buf_value(r, &b)->str;
}

// ---- operators ----

static bool numeric(const Value *v) { return v->kind == V_INT || v->kind == V_FLOAT ||
                                             v->kind == V_BOOL; }
static double as_double(const Value *v) {
    return v->kind == V_FLOAT ? v->f : v->kind == V_INT ? (double)v->i : v->b;
}
static long long as_int(const Value *v) { return v->kind == V_INT ? v->i : v->b; }

static bool equal(const Value *a, const Value *b) {
    if (numeric(a) && numeric(b))
        return a->kind == V_FLOAT || b->kind == V_FLOAT ? as_double(a) == as_double(b)
                                                        : as_int(a) == as_int(b);
    if (a->kind != b->kind) return false;
    switch (a->kind) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return str_eq(a->str, b->str);
    case V_LIST:
        if (a->list.n != b->list.n) return false;
        for (size_t k = 0; k < a->list.n; k++)
            if (!equal(a->list.v[k], b->list.v[k])) return false;
        return true;
    case V_DICT:
        if (a->dict.n != b->dict.n) return false;
        for (size_t k = 0; k < a->dict.n; k++) {
            Value **other = dict_slot((Value *)b, a->dict.key[k]);
            if (!other || !equal(a->dict.v[k], *other)) return false;
        }
        return true;
    default: return false;
    }
}

__attribute__((noreturn)) static void undefined_fail(Render *r, const Node *at, const Value *v) {
    if (v->str.n) fail(r, at, "'%.*s' is undefined", (int)v->str.n, v->str.s);
    fail(r, at, "an undefined value is used");
}

// Fails before a string or list of n bytes or items would pass RENDER_BYTES (strings that
// double in a loop would otherwise take the memory first).
static void room_check(Render *r, const Node *at, double n) {
    if (n > RENDER_BYTES) fail(r, at, "a value passes %d MiB", RENDER_BYTES >> 20);
}

static bool contains(Render *r, const Node *at, const Value *needle, const Value *hay) {
    if (hay->kind == V_UNDEF) return false;  // Jinja2's Undefined contains nothing
    if (hay->kind == V_STR) {
        if (needle->kind != V_STR)
            fail(r, at, "'in <string>' requires a string, not %s", kind_name(needle));
        return str_find(hay->str, needle->str, 0) != NULL;
    }
    if (hay->kind == V_LIST) {
        for (size_t k = 0; k < hay->list.n; k++)
            if (equal(needle, hay->list.v[k])) return true;
        return false;
    }
    if (hay->kind == V_DICT) return needle->kind == V_STR && dict_slot((Value *)hay, needle->str);
    fail(r, at, "'in' needs a string, list or dict, not %s", kind_name(hay));
}

static int compare(Render *r, const Node *at, const Value *a, const Value *b) {
    if (numeric(a) && numeric(b)) {
        double x = as_double(a), y = as_double(b);
        return (x > y) - (x < y);
    }
    if (a->kind == V_STR && b->kind == V_STR) {
        int c = memcmp(a->str.s, b->str.s, a->str.n < b->str.n ? a->str.n : b->str.n);
        return c ? c : (a->str.n > b->str.n) - (a->str.n < b->str.n);
    }
    fail(r, at, "cannot order %s and %s", kind_name(a), kind_name(b));
}

// Python's integer arithmetic in 64 bits: a result beyond them is an error, not a wrap.
static Value *int_arithmetic(Render *r, const Node *at, Op op, long long x, long long y) {
    long long v = 0;
    bool over = false;
    if ((op == OP_DIV || op == OP_FLOORDIV || op == OP_MOD) && y == 0)
        fail(r, at, "division by zero");
    switch (op) {
    case OP_ADD: over = __builtin_add_overflow(x, y, &v); break;
    case OP_SUB: over = __builtin_sub_overflow(x, y, &v); break;
    case OP_MUL: over = __builtin_mul_overflow(x, y, &v); break;
    case OP_DIV: return real(r, (double)x / (double)y);
    case OP_FLOORDIV:
        if (x == LLONG_MIN && y == -1) { over = true; break; }
        v = x / y - ((x % y != 0) && ((x < 0) != (y < 0)));
        break;
    case OP_MOD:
        if (y == -1) return integer(r, 0);
        v = x % y;
        if (v != 0 && (v < 0) != (y < 0)) v += y;
        break;
    case OP_POW:
        if (y < 0) return real(r, pow((double)x, (double)y));
        v = 1;  // by squaring
        for (long long base = x, e = y; e > 0 && !over; e >>= 1) {
            if (e & 1) over = __builtin_mul_overflow(v, base, &v);
            if (e > 1 && !over) over = __builtin_mul_overflow(base, base, &base);
        }
        break;
    default: CHECK(false);
    }
    if (over) fail(r, at, "an integer beyond 64 bits");
    return integer(r, v);
}

static Value *arithmetic(Render *r, const Node *at, Op op, Value *a, Value *b) {
    if (a->kind == V_UNDEF) undefined_fail(r, at, a);
    if (b->kind == V_UNDEF) undefined_fail(r, at, b);
    if (op == OP_ADD && a->kind == V_STR && b->kind == V_STR) {
        room_check(r, at, (double)a->str.n + (double)b->str.n);
        char *s = arena_alloc(&r->arena, a->str.n + b->str.n + 1);
        memcpy(s, a->str.s, a->str.n), memcpy(s + a->str.n, b->str.s, b->str.n);
        return string(r, s, a->str.n + b->str.n);
    }
    if (op == OP_ADD && a->kind == V_LIST && b->kind == V_LIST) {
        room_check(r, at, 8.0 * ((double)a->list.n + (double)b->list.n));
        Value *v = value_new(&r->arena, V_LIST);
        for (size_t k = 0; k < a->list.n; k++) list_push(r, v, a->list.v[k]);
        for (size_t k = 0; k < b->list.n; k++) list_push(r, v, b->list.v[k]);
        return v;
    }
    if (op == OP_MUL && (a->kind == V_STR) != (b->kind == V_STR) &&
        (a->kind == V_INT || b->kind == V_INT)) {  // "ab" * 3, 3 * "ab"
        Value *text = a->kind == V_STR ? a : b;
        long long times = a->kind == V_STR ? b->i : a->i;
        room_check(r, at, (double)text->str.n * (double)times);
        Buf buf = {0};
        for (long long k = 0; k < times; k++) buf_put(&buf, text->str.s, text->str.n);
        return buf_value(r, &buf);
    }
    if (!numeric(a) || !numeric(b))
        fail(r, at, "unsupported operand types: %s and %s", kind_name(a), kind_name(b));
    if (a->kind != V_FLOAT && b->kind != V_FLOAT) return int_arithmetic(r, at, op, as_int(a),
                                                                         as_int(b));
    double f = as_double(a), g = as_double(b);
    if ((op == OP_DIV || op == OP_FLOORDIV || op == OP_MOD) && g == 0)
        fail(r, at, "division by zero");
    switch (op) {
    case OP_ADD: return real(r, f + g);
    case OP_SUB: return real(r, f - g);
    case OP_MUL: return real(r, f * g);
    case OP_DIV: return real(r, f / g);
    case OP_FLOORDIV: return real(r, floor(f / g));
    case OP_MOD: return real(r, f - g * floor(f / g));
    case OP_POW: return real(r, pow(f, g));
    default: break;
    }
    CHECK(false);
    return NULL;
}

// ---- lookups ----

static Value *lookup(Render *r, Str name) {
    for (Frame *f = r->frame; f; f = f->up) {
        Value **v = dict_slot(f->vars, name);
        if (v) return *v;
    }
    return undefined(r, name);
}

static Value *attribute(Render *r, const Node *at, Value *obj, Str name) {
    if (obj->kind == V_UNDEF) undefined_fail(r, at, obj);
    if (obj->kind == V_DICT) {
        Value **v = dict_slot(obj, name);
        if (v) return *v;
    }
    Buf b = {0};
    char what[160];
    snprintf(what, sizeof what, "%s object' has no attribute '%.*s", kind_name(obj),
             (int)(name.n < 80 ? name.n : 80), name.s);
    buf_puts(&b, what);
    Value *u = buf_value(r, &b);
    u->kind = V_UNDEF;
    return u;
}

// Python's slice.indices(n) for bounds that may be absent.
static void slice_bounds(Render *r, const Node *at, Value *lo, Value *hi, Value *st, long long n,
                         long long *start, long long *stop, long long *step) {
    if (st && st->kind == V_NONE) st = NULL;
    if (st && st->kind != V_INT) fail(r, at, "slice step must be an integer");
    *step = st ? st->i : 1;
    if (*step == 0) fail(r, at, "slice step cannot be zero");
    long long lower = *step < 0 ? -1 : 0, upper = *step < 0 ? n - 1 : n;
    Value *bounds[2] = {lo, hi};
    long long *out[2] = {start, stop};
    for (int k = 0; k < 2; k++) {
        Value *v = bounds[k];
        if (!v || v->kind == V_NONE) {
            *out[k] = (*step < 0) == (k == 0) ? upper : lower;
            continue;
        }
        if (v->kind != V_INT) fail(r, at, "slice bounds must be integers");
        long long x = v->i;
        if (x < 0) x = x < -n ? -n - 1 : x + n;  // no overflow at LLONG_MIN
        *out[k] = x < lower ? lower : x > upper ? upper : x;
    }
}

static Value *eval(Render *r, const Node *n);

static Value *subscript(Render *r, const Node *n) {
    Value *obj = eval(r, n->a);
    if (obj->kind == V_UNDEF) undefined_fail(r, n, obj);
    if (n->kind == N_SLICE) {
        Value *lo = n->b ? eval(r, n->b) : NULL, *hi = n->c ? eval(r, n->c) : NULL,
              *st = n->d ? eval(r, n->d) : NULL;
        size_t count = 0, *cp = NULL;
        if (obj->kind == V_STR) cp = code_points(r, obj->str, &count);
        else if (obj->kind == V_LIST) count = obj->list.n;
        else fail(r, n, "cannot slice %s", kind_name(obj));
        long long start, stop, step;
        slice_bounds(r, n, lo, hi, st, (long long)count, &start, &stop, &step);
        Value *out = value_new(&r->arena, V_LIST);
        Buf b = {0};
        for (long long i = start; step > 0 ? i < stop : i > stop;) {
            if (obj->kind == V_LIST) list_push(r, out, obj->list.v[i]);
            else buf_put(&b, obj->str.s + cp[i], cp[i + 1] - cp[i]);
            if (__builtin_add_overflow(i, step, &i)) break;  // past either end: done
        }
        return obj->kind == V_LIST ? out : buf_value(r, &b);
    }
    Value *key = eval(r, n->b);
    if (obj->kind == V_DICT) {
        if (key->kind != V_STR) return undefined(r, (Str){0});
        return attribute(r, n, obj, key->str);
    }
    if (obj->kind == V_LIST || obj->kind == V_STR) {
        if (key->kind != V_INT) fail(r, n, "%s indices must be integers", kind_name(obj));
        size_t count = obj->kind == V_LIST ? obj->list.n : 0, *cp = NULL;
        if (obj->kind == V_STR) cp = code_points(r, obj->str, &count);
        long long i = key->i < 0 ? key->i + (long long)count : key->i;
        if (i < 0 || i >= (long long)count) return undefined(r, (Str){0});
        if (obj->kind == V_LIST) return obj->list.v[i];
        return string(r, obj->str.s + cp[i], cp[i + 1] - cp[i]);
    }
    fail(r, n, "%s is not subscriptable", kind_name(obj));
}

// ---- calls: a string's and a dict's methods, the globals ----

typedef struct {
    Value *pos[4];
    int n_pos;
    Str key[4];
    Value *kw[4];
    int n_kw;
} Args;

static Args args_eval(Render *r, const Node *call) {
    Args a = {0};
    for (int k = 0; k < call->n; k++) {
        if (call->keys[k].n) {
            if (a.n_kw == 4) fail(r, call, "too many keyword arguments");
            a.key[a.n_kw] = call->keys[k], a.kw[a.n_kw++] = eval(r, call->items[k]);
        } else {
            if (a.n_pos == 4 || a.n_kw) fail(r, call, "too many or misplaced arguments");
            a.pos[a.n_pos++] = eval(r, call->items[k]);
        }
    }
    return a;
}

// Argument i, or keyword name, or NULL.
static Value *arg(const Args *a, int i, const char *name) {
    if (i < a->n_pos) return a->pos[i];
    for (int k = 0; k < a->n_kw; k++)
        if (str_is(a->key[k], name)) return a->kw[k];
    return NULL;
}

// What a method, filter or test takes: at most `positional` arguments so, and the keywords
// named in `keywords` (space-separated). Anything else is refused rather than ignored.
typedef struct {
    const char *name;
    int positional;
    const char *keywords;
} Signature;

static const Signature STRING_METHODS[] = {
    {"startswith", 1, ""}, {"endswith", 1, ""}, {"strip", 1, ""}, {"lstrip", 1, ""},
    {"rstrip", 1, ""}, {"split", 2, "sep maxsplit"}, {"lower", 0, ""}, {"upper", 0, ""},
    {"capitalize", 0, ""}, {"title", 0, ""}, {"replace", 3, ""}, {"find", 1, ""},
    {"join", 1, ""}};
static const Signature DICT_METHODS[] = {
    {"get", 2, ""}, {"items", 0, ""}, {"keys", 0, ""}, {"values", 0, ""}};
static const Signature FILTER_SIGNATURES[] = {
    {"length", 0, ""}, {"count", 0, ""}, {"trim", 1, "chars"}, {"tojson", 1, "indent"},
    {"string", 0, ""}, {"lower", 0, ""}, {"upper", 0, ""}, {"capitalize", 0, ""},
    {"title", 0, ""}, {"replace", 3, "old new count"}, {"default", 2, "default_value boolean"},
    {"d", 2, "default_value boolean"}, {"join", 1, "d"}, {"first", 0, ""}, {"last", 0, ""},
    {"list", 0, ""}, {"reverse", 0, ""}, {"items", 0, ""}, {"int", 0, ""}, {"float", 0, ""},
    {"abs", 0, ""}, {"safe", 0, ""}};
static const Signature TEST_SIGNATURES[] = {
    {"divisibleby", 1, "num"}, {"eq", 1, "other"}, {"equalto", 1, "other"}, {"ne", 1, "other"},
    {"sameas", 1, "other"}};

static bool keyword_listed(const char *keywords, Str key) {
    for (const char *k = keywords; *k;) {
        size_t n = strcspn(k, " ");
        if (str_eq((Str){k, n}, key)) return true;
        k += n + (k[n] == ' ');
    }
    return false;
}

// Checks a's arguments against name's entry of table (none: no arguments at all).
static void args_check(Render *r, const Node *at, const Signature *table, size_t n, Str name,
                       const Args *a, const char *what) {
    Signature sig = {"", 0, ""};
    for (size_t k = 0; k < n; k++)
        if (str_is(name, table[k].name)) sig = table[k];
    if (a->n_pos > sig.positional)
        fail(r, at, "%s '%.*s' takes %d positional argument%s in titan's chat-template subset",
             what, (int)name.n, name.s, sig.positional, sig.positional == 1 ? "" : "s");
    for (int k = 0; k < a->n_kw; k++)
        if (!keyword_listed(sig.keywords, a->key[k]))
            fail(r, at, "%s '%.*s': argument '%.*s' is not in titan's chat-template subset",
                 what, (int)name.n, name.s, (int)a->key[k].n, a->key[k].s);
}

static Str arg_str(Render *r, const Node *at, const Args *a, int i, const char *name) {
    Value *v = arg(a, i, name);
    if (!v || v->kind != V_STR) fail(r, at, "argument '%s' must be a string", name);
    return v->str;
}

static bool affix_match(Str s, Str affix, bool start) {
    return affix.n <= s.n && memcmp(s.s + (start ? 0 : s.n - affix.n), affix.s, affix.n) == 0;
}

static Value *join(Render *r, Value *list, Str sep, const Node *at) {
    if (list->kind != V_LIST) fail(r, at, "join needs a list, not %s", kind_name(list));
    double total = (double)sep.n * (double)list->list.n;
    for (size_t k = 0; k < list->list.n; k++)
        total += list->list.v[k]->kind == V_STR ? (double)list->list.v[k]->str.n : 32;
    room_check(r, at, total);
    Buf b = {0};
    for (size_t k = 0; k < list->list.n; k++) {
        if (k) buf_put(&b, sep.s, sep.n);
        value_str(&b, list->list.v[k]);
    }
    return buf_value(r, &b);
}

static Value *string_method(Render *r, const Node *at, Str s, Str m, const Args *a) {
    args_check(r, at, STRING_METHODS, sizeof STRING_METHODS / sizeof *STRING_METHODS, m, a,
               "string method");
    if (str_is(m, "startswith") || str_is(m, "endswith")) {
        Value *affix = arg(a, 0, "prefix");
        bool start = m.s[0] == 's', hit = false;
        if (affix && affix->kind == V_LIST) {
            for (size_t k = 0; k < affix->list.n; k++)
                hit = hit || (affix->list.v[k]->kind == V_STR &&
                              affix_match(s, affix->list.v[k]->str, start));
            return boolean(hit);
        }
        return boolean(affix_match(s, arg_str(r, at, a, 0, "prefix"), start));
    }
    if (str_is(m, "strip") || str_is(m, "lstrip") || str_is(m, "rstrip")) {
        Value *chars = arg(a, 0, "chars");
        Str set = chars && chars->kind == V_STR ? chars->str : (Str){0};
        Str out = str_strip(r, s, chars && chars->kind == V_STR ? &set : NULL, m.s[0] != 'r',
                            m.s[0] != 'l');
        return string(r, out.s, out.n);
    }
    if (str_is(m, "split")) {
        Value *sep = arg(a, 0, "sep"), *max = arg(a, 1, "maxsplit");
        Str set = sep && sep->kind == V_STR ? sep->str : (Str){0};
        return str_split(r, s, sep && sep->kind == V_STR ? &set : NULL,
                         max && max->kind == V_INT ? max->i : -1, at);
    }
    if (str_is(m, "lower") || str_is(m, "upper") || str_is(m, "capitalize") ||
        str_is(m, "title")) {
        Str out = str_case(r, s, m.s[0] == 'l' ? 0 : m.s[0] == 'u' ? 1 : m.s[0] == 'c' ? 2 : 3);
        return string(r, out.s, out.n);
    }
    if (str_is(m, "replace")) {
        Value *count = arg(a, 2, "count");
        Str old = arg_str(r, at, a, 0, "old"), new = arg_str(r, at, a, 1, "new");
        double hits = old.n ? (double)(s.n / old.n) : (double)s.n + 1;
        room_check(r, at, (double)s.n + hits * (double)new.n);
        Str out = str_replace(r, s, old, new, count && count->kind == V_INT ? count->i : -1);
        return string(r, out.s, out.n);
    }
    if (str_is(m, "find")) {
        const char *hit = str_find(s, arg_str(r, at, a, 0, "sub"), 0);
        if (!hit) return integer(r, -1);
        size_t n;
        code_points(r, (Str){s.s, (size_t)(hit - s.s)}, &n);
        return integer(r, (long long)n);
    }
    if (str_is(m, "join")) return join(r, arg(a, 0, "iterable") ? arg(a, 0, "iterable") : &NONE,
                                       s, at);
    fail(r, at, "a string has no method '%.*s' in titan's chat-template subset", (int)m.n, m.s);
}

static Value *dict_method(Render *r, const Node *at, Value *d, Str m, const Args *a) {
    args_check(r, at, DICT_METHODS, sizeof DICT_METHODS / sizeof *DICT_METHODS, m, a,
               "dict method");
    if (str_is(m, "get")) {
        Str key = arg_str(r, at, a, 0, "key");
        Value **v = dict_slot(d, key), *fallback = arg(a, 1, "default");
        return v ? *v : fallback ? fallback : &NONE;
    }
    bool items = str_is(m, "items"), keys = str_is(m, "keys");
    if (!items && !keys && !str_is(m, "values"))
        fail(r, at, "a dict has no method '%.*s' in titan's chat-template subset", (int)m.n,
             m.s);
    Value *out = value_new(&r->arena, V_LIST);
    for (size_t k = 0; k < d->dict.n; k++) {
        Value *key = string(r, d->dict.key[k].s, d->dict.key[k].n);
        if (items) {
            Value *pair = value_new(&r->arena, V_LIST);
            list_push(r, pair, key), list_push(r, pair, d->dict.v[k]);
            list_push(r, out, pair);
        } else {
            list_push(r, out, keys ? key : d->dict.v[k]);
        }
    }
    return out;
}

static Value *global_call(Render *r, const Node *n, Str name, const Args *a) {
    if (str_is(name, "raise_exception")) {
        Str message = a->n_pos ? to_str(r, a->pos[0]) : (Str){"", 0};
        fail(r, n, "the chat template raised: %.*s", (int)message.n, message.s);
    }
    if (str_is(name, "namespace")) {
        Value *ns = value_new(&r->arena, V_DICT);
        ns->ns = true;
        if (a->n_pos && a->pos[0]->kind == V_DICT)
            for (size_t k = 0; k < a->pos[0]->dict.n; k++)
                dict_set(r, ns, a->pos[0]->dict.key[k], a->pos[0]->dict.v[k]);
        for (int k = 0; k < a->n_kw; k++) dict_set(r, ns, a->key[k], a->kw[k]);
        return ns;
    }
    if (str_is(name, "range")) {
        long long bound[3] = {0, 0, 1};
        if (a->n_pos < 1 || a->n_pos > 3) fail(r, n, "range takes 1 to 3 integers");
        for (int k = 0; k < a->n_pos; k++) {
            if (a->pos[k]->kind != V_INT) fail(r, n, "range takes integers");
            bound[a->n_pos == 1 ? 1 : k] = a->pos[k]->i;
        }
        if (bound[2] == 0) fail(r, n, "range step cannot be zero");
        Value *out = value_new(&r->arena, V_LIST);
        for (long long i = bound[0]; bound[2] > 0 ? i < bound[1] : i > bound[1];) {
            if (out->list.n >= 1000000) fail(r, n, "range longer than a million");
            list_push(r, out, integer(r, i));
            if (__builtin_add_overflow(i, bound[2], &i)) break;
        }
        return out;
    }
    fail(r, n, "'%.*s' is not a function in titan's chat-template subset", (int)name.n, name.s);
}

static Value *call(Render *r, const Node *n) {
    Args a = args_eval(r, n);
    if (n->a->kind == N_NAME) {
        Value *v = lookup(r, n->a->name);
        if (v->kind != V_UNDEF) fail(r, n, "'%.*s' is not callable", (int)n->a->name.n,
                                     n->a->name.s);
        return global_call(r, n, n->a->name, &a);
    }
    if (n->a->kind != N_ATTR) fail(r, n, "only methods and global functions can be called");
    Value *obj = eval(r, n->a->a);
    if (obj->kind == V_UNDEF) undefined_fail(r, n, obj);
    if (obj->kind == V_STR) return string_method(r, n, obj->str, n->a->name, &a);
    // A method call, as Python's getattr finds it before any item: `properties.items()` of a
    // tool schema whose properties include one named "items".
    if (obj->kind == V_DICT) return dict_method(r, n, obj, n->a->name, &a);
    fail(r, n, "%s has no method '%.*s'", kind_name(obj), (int)n->a->name.n, n->a->name.s);
}

// ---- filters and tests ----

static long long length(Render *r, const Node *at, Value *v) {
    size_t n;
    switch (v->kind) {
    case V_UNDEF: return 0;
    case V_STR: code_points(r, v->str, &n); return (long long)n;
    case V_LIST: return (long long)v->list.n;
    case V_DICT: return (long long)v->dict.n;
    default: fail(r, at, "%s has no length", kind_name(v));
    }
}

// A list's items, a dict's keys or a string's characters, as a for-loop iterates them.
static Value *iterable(Render *r, const Node *at, Value *v) {
    if (v->kind == V_LIST) return v;
    Value *out = value_new(&r->arena, V_LIST);
    if (v->kind == V_UNDEF) return out;
    if (v->kind == V_DICT) {
        for (size_t k = 0; k < v->dict.n; k++)
            list_push(r, out, string(r, v->dict.key[k].s, v->dict.key[k].n));
    } else if (v->kind == V_STR) {
        size_t n, *cp = code_points(r, v->str, &n);
        for (size_t k = 0; k < n; k++) list_push(r, out, string(r, v->str.s + cp[k],
                                                                 cp[k + 1] - cp[k]));
    } else {
        fail(r, at, "%s is not iterable", kind_name(v));
    }
    return out;
}

// Jinja2's int and float filters: a number converted, a string read whole as Python's int()
// or float() reads it (surrounding whitespace allowed), anything else 0. A float beyond 64-bit
// integers (Python's have no bound) is an error, as inf and nan are in Jinja2.
static Value *number_of(Render *r, const Node *at, const Value *v, bool to_int) {
    double x = 0;
    bool is_int = v->kind == V_INT || v->kind == V_BOOL;
    long long i = is_int ? as_int(v) : 0;
    if (v->kind == V_FLOAT) x = v->f;
    if (v->kind == V_STR) {
        Str t = str_strip(r, v->str, NULL, true, true);
        char *text = arena_dup(r, t.s, t.n), *end;
        bool hex = strchr(text, 'x') || strchr(text, 'X') || strchr(text, 'p');
        errno = 0;
        i = strtoll(text, &end, 10);
        is_int = t.n > 0 && *end == '\0' && errno == 0;
        x = strtod(text, &end);
        if (!is_int && (t.n == 0 || *end != '\0' || hex)) x = 0;
    }
    if (!to_int) return real(r, is_int ? (double)i : x);
    if (is_int) return integer(r, i);
    if (!isfinite(x) || fabs(x) >= 9.2e18) fail(r, at, "int: %g is beyond 64-bit integers", x);
    return integer(r, (long long)x);
}

static Value *filter(Render *r, const Node *n) {
    Value *v = eval(r, n->a);
    Args a = args_eval(r, n);
    Str f = n->name;
    args_check(r, n, FILTER_SIGNATURES, sizeof FILTER_SIGNATURES / sizeof *FILTER_SIGNATURES, f,
               &a, "filter");
    if (str_is(f, "default") || str_is(f, "d")) {
        Value *fallback = arg(&a, 0, "default_value"), *b = arg(&a, 1, "boolean");
        bool use = v->kind == V_UNDEF || (b && truthy(b) && !truthy(v));
        return use ? (fallback ? fallback : string(r, "", 0)) : v;
    }
    if (str_is(f, "safe")) return v;
    if (str_is(f, "length") || str_is(f, "count")) return integer(r, length(r, n, v));
    if (str_is(f, "tojson")) {
        Value *indent = arg(&a, 0, "indent");
        if (indent && indent->kind == V_INT && (indent->i < 0 || indent->i > 64))
            fail(r, n, "tojson: indent %lld is outside [0, 64]", indent->i);
        Buf b = {0};
        if (!value_json(&b, v, indent && indent->kind == V_INT ? (int)indent->i : -1, 0)) {
            free(b.s);
            fail(r, n, "tojson: an undefined value");
        }
        return buf_value(r, &b);
    }
    if (str_is(f, "list") || str_is(f, "first") || str_is(f, "last") || str_is(f, "reverse")) {
        if (v->kind == V_UNDEF) undefined_fail(r, n, v);
        Value *items = iterable(r, n, v);
        if (str_is(f, "list")) return items;
        if (str_is(f, "first") || str_is(f, "last")) {
            if (!items->list.n) return undefined(r, (Str){0});
            return items->list.v[f.s[0] == 'f' ? 0 : items->list.n - 1];
        }
        if (v->kind == V_STR) {
            Buf b = {0};
            for (size_t k = items->list.n; k-- > 0;)
                buf_put(&b, items->list.v[k]->str.s, items->list.v[k]->str.n);
            return buf_value(r, &b);
        }
        Value *out = value_new(&r->arena, V_LIST);
        for (size_t k = items->list.n; k-- > 0;) list_push(r, out, items->list.v[k]);
        return out;
    }
    if (str_is(f, "items")) {
        if (v->kind == V_UNDEF) return value_new(&r->arena, V_LIST);
        if (v->kind != V_DICT) fail(r, n, "items needs a dict, not %s", kind_name(v));
        return dict_method(r, n, v, f, &a);
    }
    if (str_is(f, "join")) {
        Value *sep = arg(&a, 0, "d");
        return join(r, iterable(r, n, v), sep ? to_str(r, sep) : (Str){"", 0}, n);
    }
    if (str_is(f, "int") || str_is(f, "float") || str_is(f, "abs")) {
        if (str_is(f, "abs")) {
            if (!numeric(v)) fail(r, n, "abs needs a number, not %s", kind_name(v));
            if (v->kind == V_FLOAT) return real(r, fabs(v->f));
            return int_arithmetic(r, n, OP_MUL, as_int(v), as_int(v) < 0 ? -1 : 1);
        }
        return number_of(r, n, v, f.s[0] == 'i');
    }
    Str s = to_str(r, v);  // the string filters
    if (str_is(f, "string")) return string(r, s.s, s.n);
    if (str_is(f, "trim")) {
        Value *chars = arg(&a, 0, "chars");
        Str set = chars && chars->kind == V_STR ? chars->str : (Str){0};
        Str out = str_strip(r, s, chars && chars->kind == V_STR ? &set : NULL, true, true);
        return string(r, out.s, out.n);
    }
    if (str_is(f, "replace")) return string_method(r, n, s, f, &a);
    Str out = str_case(r, s, str_is(f, "lower") ? 0 : str_is(f, "upper") ? 1
                             : str_is(f, "capitalize") ? 2 : 4);
    return string(r, out.s, out.n);
}

static bool test(Render *r, const Node *n, Value *v) {
    Str t = n->name;
    Args a = args_eval(r, n);
    args_check(r, n, TEST_SIGNATURES, sizeof TEST_SIGNATURES / sizeof *TEST_SIGNATURES, t, &a,
               "test");
    if (str_is(t, "defined")) return v->kind != V_UNDEF;
    if (str_is(t, "undefined")) return v->kind == V_UNDEF;
    if (str_is(t, "none")) return v->kind == V_NONE;
    if (str_is(t, "string")) return v->kind == V_STR;
    if (str_is(t, "number")) return numeric(v);  // Python's bool is a Number
    if (str_is(t, "integer")) return v->kind == V_INT;
    if (str_is(t, "float")) return v->kind == V_FLOAT;
    if (str_is(t, "boolean")) return v->kind == V_BOOL;
    if (str_is(t, "true")) return v->kind == V_BOOL && v->b;
    if (str_is(t, "false")) return v->kind == V_BOOL && !v->b;
    if (str_is(t, "mapping")) return v->kind == V_DICT;
    if (str_is(t, "sequence") || str_is(t, "iterable"))
        return v->kind == V_LIST || v->kind == V_STR || v->kind == V_DICT;
    if (str_is(t, "even") || str_is(t, "odd") || str_is(t, "divisibleby")) {
        if (v->kind != V_INT) fail(r, n, "'%.*s' needs an integer", (int)t.n, t.s);
        Value *d = arg(&a, 0, "num");
        long long by = t.s[0] == 'd' ? (d && d->kind == V_INT ? d->i : 0) : 2;
        if (by == 0) fail(r, n, "divisibleby needs a nonzero integer");
        return t.s[0] == 'o' ? v->i % 2 != 0 : v->i % by == 0;
    }
    Value *other = arg(&a, 0, "other");
    if (!other) fail(r, n, "test '%.*s' needs an argument", (int)t.n, t.s);
    if (str_is(t, "ne")) return !equal(v, other);
    if (str_is(t, "sameas")) return v == other || (v->kind <= V_BOOL && equal(v, other));
    return equal(v, other);  // eq, equalto
}

// ---- expressions ----

// One link of a comparison chain: a op b.
static bool compared(Render *r, const Node *at, int op, const Value *a, const Value *b) {
    switch ((Op)op) {
    case OP_EQ: return equal(a, b);
    case OP_NE: return !equal(a, b);
    case OP_LT: return compare(r, at, a, b) < 0;
    case OP_LE: return compare(r, at, a, b) <= 0;
    case OP_GT: return compare(r, at, a, b) > 0;
    case OP_GE: return compare(r, at, a, b) >= 0;
    case OP_IN: return contains(r, at, a, b);
    case OP_NOTIN: return !contains(r, at, a, b);
    default: CHECK(false);
    }
    return false;
}

static Value *eval(Render *r, const Node *n) {
    Value *a, *b;
    if (++r->steps > RENDER_STEPS) fail(r, n, "the template runs too long (a loop without end?)");
    switch (n->kind) {
    case N_LIT: return n->lit;
    case N_NAME: return lookup(r, n->name);
    case N_ATTR: return attribute(r, n, eval(r, n->a), n->name);
    case N_INDEX: case N_SLICE: return subscript(r, n);
    case N_CALL: return call(r, n);
    case N_FILTER: return filter(r, n);
    case N_TEST: return boolean(test(r, n, eval(r, n->a)) != n->op);
    case N_NOT: return boolean(!truthy(eval(r, n->a)));
    case N_NEG:
        a = eval(r, n->a);
        if (!numeric(a)) fail(r, n, "bad operand for unary -: %s", kind_name(a));
        return a->kind == V_FLOAT ? real(r, -a->f) : int_arithmetic(r, n, OP_SUB, 0, as_int(a));
    case N_AND: a = eval(r, n->a); return truthy(a) ? eval(r, n->b) : a;
    case N_OR: a = eval(r, n->a); return truthy(a) ? a : eval(r, n->b);
    case N_COND:
        if (truthy(eval(r, n->b))) return eval(r, n->a);
        return n->c ? eval(r, n->c) : undefined(r, (Str){0});
    case N_LIST: {
        Value *v = value_new(&r->arena, V_LIST);
        for (int k = 0; k < n->n; k++) list_push(r, v, eval(r, n->items[k]));
        return v;
    }
    case N_DICT: {
        Value *v = value_new(&r->arena, V_DICT);
        for (int k = 0; k + 1 < n->n; k += 2) {
            Value *key = eval(r, n->items[k]);
            if (key->kind != V_STR) fail(r, n->items[k], "dict keys must be strings");
            dict_set(r, v, key->str, eval(r, n->items[k + 1]));
        }
        return v;
    }
    case N_COMPARE:
        a = eval(r, n->items[0]);
        for (int k = 1; k < n->n; k++, a = b)
            if (!compared(r, n, n->ops[k - 1], a, b = eval(r, n->items[k]))) return &FALSE_;
        return &TRUE_;
    case N_BIN:
        a = eval(r, n->a), b = eval(r, n->b);
        switch ((Op)n->op) {
        case OP_CAT: {
            Str x = to_str(r, a), y = to_str(r, b);
            room_check(r, n, (double)x.n + (double)y.n);
            char *s = arena_alloc(&r->arena, x.n + y.n + 1);
            memcpy(s, x.s, x.n), memcpy(s + x.n, y.s, y.n);
            return string(r, s, x.n + y.n);
        }
        default: return arithmetic(r, n, (Op)n->op, a, b);
        }
    default: break;
    }
    CHECK(false);
    return NULL;
}

// ---- statements ----

static void emit(Render *r, Str s) {
    if (r->len + s.n > RENDER_BYTES) fail(r, r->j->body, "the rendering passes %d MiB",
                                          RENDER_BYTES >> 20);
    r->out = xgrow(r->out, &r->cap, r->len + s.n + 1, 1);
    memcpy(r->out + r->len, s.s, s.n);
    r->len += s.n;
}

static void run_body(Render *r, const Node *body);

static void set_var(Render *r, Str name, Value *v) { dict_set(r, r->frame->vars, name, v); }

// Binds a loop's names to item in a fresh scope (Jinja2 starts every iteration with a new
// one: what the body sets stays in its iteration).
static void loop_bind(Render *r, const Node *n, Frame *frame, Value *item) {
    frame->vars = value_new(&r->arena, V_DICT);
    if (!n->name2.n) {
        set_var(r, n->name, item);
        return;
    }
    if (item->kind != V_LIST || item->list.n != 2)
        fail(r, n, "cannot unpack %s into two names", kind_name(item));
    set_var(r, n->name, item->list.v[0]), set_var(r, n->name2, item->list.v[1]);
}

static void run_for(Render *r, const Node *n) {
    Value *items = iterable(r, n, eval(r, n->a));
    Frame frame = {.up = r->frame};
    r->frame = &frame;
    Value *kept = items;
    if (n->d) {  // the loop filter runs before loop.length is known
        kept = value_new(&r->arena, V_LIST);
        for (size_t k = 0; k < items->list.n; k++) {
            loop_bind(r, n, &frame, items->list.v[k]);
            if (truthy(eval(r, n->d))) list_push(r, kept, items->list.v[k]);
        }
    }
    size_t count = kept->list.n;
    for (size_t k = 0; k < count; k++) {
        Value *loop = value_new(&r->arena, V_DICT);
        loop_bind(r, n, &frame, kept->list.v[k]);
        dict_set(r, loop, (Str){"index0", 6}, integer(r, (long long)k));
        dict_set(r, loop, (Str){"index", 5}, integer(r, (long long)k + 1));
        dict_set(r, loop, (Str){"revindex0", 9}, integer(r, (long long)(count - k - 1)));
        dict_set(r, loop, (Str){"revindex", 8}, integer(r, (long long)(count - k)));
        dict_set(r, loop, (Str){"first", 5}, boolean(k == 0));
        dict_set(r, loop, (Str){"last", 4}, boolean(k + 1 == count));
        dict_set(r, loop, (Str){"length", 6}, integer(r, (long long)count));
        if (k > 0) dict_set(r, loop, (Str){"previtem", 8}, kept->list.v[k - 1]);
        if (k + 1 < count) dict_set(r, loop, (Str){"nextitem", 8}, kept->list.v[k + 1]);
        set_var(r, (Str){"loop", 4}, loop);
        run_body(r, n->b);
        int control = r->control;
        r->control = 0;
        if (control == 1) break;
    }
    r->frame = frame.up;
    if (count == 0 && n->c) run_body(r, n->c);
}

static void run_statement(Render *r, const Node *n) {
    switch (n->kind) {
    case N_TEXT: emit(r, n->lit->str); return;
    case N_OUT: emit(r, to_str(r, eval(r, n->a))); return;
    case N_IF:
        if (truthy(eval(r, n->a))) run_body(r, n->b);
        else if (n->c && n->c->kind == N_IF) run_statement(r, n->c);
        else if (n->c) run_body(r, n->c);
        return;
    case N_FOR: run_for(r, n); return;
    case N_SET: {
        Value *v = eval(r, n->a);
        if (!n->name2.n) { set_var(r, n->name, v); return; }
        Value *ns = lookup(r, n->name);
        if (ns->kind != V_DICT || !ns->ns)
            fail(r, n, "cannot set an attribute of '%.*s': not a namespace()", (int)n->name.n,
                 n->name.s);
        dict_set(r, ns, n->name2, v);
        return;
    }
    case N_GEN: {  // a call block: its own scope, as transformers' AssistantTracker's
        size_t start = r->len;
        Frame frame = {.vars = value_new(&r->arena, V_DICT), .up = r->frame};
        r->frame = &frame;
        r->generation++;
        run_body(r, n->b);
        r->frame = frame.up;
        if (--r->generation == 0 && r->spans && r->len > start) {
            JinjaSpans *s = r->spans;
            if (s->n == s->cap) {
                s->cap = s->cap ? 2 * s->cap : 8;
                s->start = realloc(s->start, (size_t)s->cap * sizeof(size_t));
                s->end = realloc(s->end, (size_t)s->cap * sizeof(size_t));
                CHECK(s->start && s->end);
            }
            s->start[s->n] = start, s->end[s->n++] = r->len;
        }
        return;
    }
    case N_BREAK: r->control = 1; return;
    case N_CONTINUE: r->control = 2; return;
    default: CHECK(false);
    }
}

static void run_body(Render *r, const Node *body) {
    for (int k = 0; k < body->n && !r->control; k++) run_statement(r, body->items[k]);
}

char *jinja_render(const Jinja *j, const json_t *vars, size_t *len, JinjaSpans *spans,
                   char *err, size_t errlen) {
    Render *r = xcalloc(1, sizeof(Render));
    r->j = j, r->spans = spans, r->err = err, r->errlen = errlen;
    if (spans) *spans = (JinjaSpans){0};
    Frame globals = {0}, top = {0};
    char *out = NULL;
    if (!setjmp(r->fail)) {
        globals.vars = json_is_object(vars) ? from_json(r, vars) : value_new(&r->arena, V_DICT);
        top = (Frame){.vars = value_new(&r->arena, V_DICT), .up = &globals};
        r->frame = &top;
        emit(r, (Str){"", 0});
        run_body(r, j->body);
        out = r->out, *len = r->len;
        out[r->len] = '\0';
    } else {
        free(r->out);
        if (spans) jinja_spans_free(spans);
    }
    arena_free(&r->arena);
    free(r);
    return out;
}
