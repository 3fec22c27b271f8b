// R's lazy-load databases (.rdb), as R writes a package's data/ (Debian's r-cran-janeaustenr
// ships Jane Austen's six novels as data/Rdata.rdb), read without R.
//
// The file is a sequence of records, one per object: a 4-byte big-endian length (the object's
// serialized size) and a zlib stream (R's default compression) of the object serialized as in
// R Internals, "Serialization Formats": "X\n" (XDR, big-endian), the format version (2 or 3),
// the writer's and the minimal reader's R versions, and for version 3 the native encoding's
// name; then the object. A character vector (STRSXP) is its flags, its length, and its
// elements, each a CHARSXP: flags, a byte length (-1 for NA) and the bytes. Only character
// vectors are documents, so other records (data frames, functions, ...) are skipped whole;
// a vector's attributes follow its elements and are not needed. Elements are passed as their
// bytes: R writes package data in UTF-8 (or ASCII), which the tokenizer expects.
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/errors.h"
#include "data/dataset.h"

#define R_STRSXP 16
#define R_CHARSXP 9
#define R_TYPE_MASK 0xff  // the low byte of an item's flags; the rest: attributes, encoding
#define R_NA_LENGTH (-1)  // a CHARSXP of this length is NA_character_
#define R_LONG_LENGTH (-1)  // a vector of this length has 2^31 elements or more

typedef struct {
    const uint8_t *at, *end;
    const char *file;
    size_t offset;  // the record's offset in the file, for messages
} Cursor;

static void cursor_fail(const Cursor *c, const char *what) {
    die_user("%s: the record at byte %zu is %s", c->file, c->offset, what);
}

static const uint8_t *bytes_take(Cursor *c, size_t n) {
    if ((size_t)(c->end - c->at) < n) cursor_fail(c, "truncated (not an R serialized object)");
    const uint8_t *p = c->at;
    c->at += n;
    return p;
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int32_t int_take(Cursor *c) { return (int32_t)be32(bytes_take(c, 4)); }

static void header_take(Cursor *c) {
    if (memcmp(bytes_take(c, 2), "X\n", 2) != 0)
        cursor_fail(c, "not in R's XDR serialization (only \"X\\n\" is read)");
    int32_t version = int_take(c);
    int_take(c), int_take(c);  // the writer's and the minimal reader's R versions
    if (version == 3) bytes_take(c, (size_t)int_take(c));  // the native encoding's name
    else if (version != 2) cursor_fail(c, "in an R serialization version other than 2 or 3");
}

static int64_t length_take(Cursor *c) {
    int32_t n = int_take(c);
    if (n != R_LONG_LENGTH) return n;
    int64_t upper = int_take(c);
    return upper << 32 | (uint32_t)int_take(c);
}

// The vector's elements, NA dropped, joined by "\n" into text (which the record's size bounds:
// every element's bytes are in it, each after 8 bytes of flags and length).
static size_t strings_join(Cursor *c, int64_t n, char *text) {
    size_t len = 0;
    for (int64_t i = 0, kept = 0; i < n; i++) {
        if ((int_take(c) & R_TYPE_MASK) != R_CHARSXP)
            cursor_fail(c, "a character vector with an element that is not a string");
        int32_t bytes = int_take(c);
        if (bytes == R_NA_LENGTH) continue;
        if (bytes < 0) cursor_fail(c, "a character vector with a negative string length");
        if (kept++ > 0) text[len++] = '\n';
        memcpy(text + len, bytes_take(c, (size_t)bytes), (size_t)bytes);
        len += (size_t)bytes;
    }
    return len;
}

static void object_read(Cursor *c, size_t size, uint64_t bytes_read, DocumentFn fn, void *ctx) {
    header_take(c);
    if ((int_take(c) & R_TYPE_MASK) != R_STRSXP) return;
    int64_t n = length_take(c);
    if (n < 0) cursor_fail(c, "a character vector with a negative length");
    char *text = xmalloc(size);
    size_t len = strings_join(c, n, text);
    fn(text, len, NULL, bytes_read, ctx);
    free(text);
}

void rdata_for_each_document(const char *file, const uint8_t *data, size_t len,
                             uint64_t bytes_read, DocumentFn fn, void *ctx) {
    for (size_t at = 0; at < len;) {
        Cursor head = {.at = data + at, .end = data + len, .file = file, .offset = at};
        uLongf stated = be32(bytes_take(&head, 4)), size = stated;
        uLong packed = (uLong)(len - at - 4);
        uint8_t *object = xmalloc(size);
        if (uncompress2(object, &size, head.at, &packed) != Z_OK || size != stated)
            cursor_fail(&head, "not a zlib stream of the size it states");
        Cursor c = {.at = object, .end = object + size, .file = file, .offset = at};
        object_read(&c, size, bytes_read, fn, ctx);
        free(object);
        at += 4 + packed;
    }
}
