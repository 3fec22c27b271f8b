// The tokenizer half of a Hugging Face export (convert --to hf, checkpoint.last_save_in_hf), so
// that AutoTokenizer.from_pretrained and generate work on the folder as on a hub model.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "convert/convert.h"
#include "core/errors.h"
#include "core/files.h"
#include "data/tokenizer.h"
#include "models/decoder/hf.h"

static void file_copy(const char *from, const char *dir, const char *name) {
    char *text, path[4096], why[256];
    size_t len;
    FileReadResult r = file_read_all(from, TOKENIZER_MAX_BYTES, &text, &len);
    if (r != FILE_READ_OK)
        die_user("%s %s", from,
                 file_read_why(r, TOKENIZER_MAX_BYTES, "a tokenizer file", why, sizeof why));
    CHECK(snprintf(path, sizeof path, "%s/%s", dir, name) < (int)sizeof path);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, len, f) != len || fclose(f) != 0) die_user("cannot write %s", path);
    free(text);
}

// A Hugging Face tokenizer.json (the file, or the folder holding it) and the
// tokenizer_config.json beside it, as they are.
static void copy_hf(const char *path, const char *dir) {
    struct stat st;
    char file[4096], config[4096];
    bool folder = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    CHECK(snprintf(file, sizeof file, folder ? "%s/tokenizer.json" : "%s", path) <
          (int)sizeof file);
    const char *slash = strrchr(file, '/');
    int n = slash ? (int)(slash - file + 1) : 0;
    CHECK(snprintf(config, sizeof config, "%.*stokenizer_config.json", n, file) <
          (int)sizeof config);
    file_copy(file, dir, "tokenizer.json");
    if (stat(config, &st) == 0) file_copy(config, dir, "tokenizer_config.json");
}

static json_t *id_json(int32_t id) { return id < 0 ? json_null() : json_integer(id); }

// transformers' generation_config.json (as save_pretrained writes it) and the ids in
// config.json, which generate reads to start and stop.
static void write_special_ids(const char *dir, int32_t bos, int32_t eos) {
    char path[4096];
    CHECK(snprintf(path, sizeof path, "%s/config.json", dir) < (int)sizeof path);
    json_error_t e;
    json_t *c = json_load_file(path, 0, &e);
    if (!c) die_user("%s: %s", path, e.text);
    json_object_set_new(c, "bos_token_id", id_json(bos));
    json_object_set_new(c, "eos_token_id", id_json(eos));
    hf_config_write(dir, c);
    json_t *g = json_pack("{s:b, s:o, s:o}", "_from_model_config", 1, "bos_token_id",
                          id_json(bos), "eos_token_id", id_json(eos));
    CHECK(snprintf(path, sizeof path, "%s/generation_config.json", dir) < (int)sizeof path);
    if (json_dump_file(g, path, JSON_INDENT(2)) != 0) die_user("cannot write %s", path);
    json_decref(g);
}

void convert_hf_tokenizer(const char *tokenizer_path, const char *dir, char *note,
                          size_t notelen) {
    if (!tokenizer_path || !strcmp(tokenizer_path, "bytes")) {
        snprintf(note, notelen, "no tokenizer (the run's data is %s)",
                 tokenizer_path ? "bytes" : "pre-tokenized shards");
        return;
    }
    char err[512];
    Tokenizer *t = tokenizer_try_load(tokenizer_path, err, sizeof err);
    if (!t) {
        snprintf(note, notelen, "no tokenizer (%.400s)", err);
        return;
    }
    const char *format = tokenizer_format(t);
    if (!strcmp(format, "huggingface")) {
        copy_hf(tokenizer_path, dir);
    } else if (!strcmp(format, "tiktoken")) {
        if (!tokenizer_write_hf(t, dir, err, sizeof err)) die_user("%s", err);
    } else {
        snprintf(note, notelen, "no tokenizer (%s is GPT-2's encoder.json + vocab.bpe, which "
                 "titan does not convert)", tokenizer_path);
        tokenizer_free(t);
        return;
    }
    write_special_ids(dir, tokenizer_bos_id(t), tokenizer_eos_id(t));
    snprintf(note, notelen, "tokenizer.json (%s %s), generation_config.json", format,
             tokenizer_path);
    tokenizer_free(t);
}
