// The registry's table: one line per architecture (its ModelSpec is defined in its folder).
#include "models/registry.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "models/decoder/hf.h"

static const ModelSpec *const SPECS[] = {&LLAMA3_SPEC, &QWEN3_SPEC, &DEEPSEEK_V3_SPEC,
                                         &FLUX_SPEC};
#define N_SPECS (int)(sizeof SPECS / sizeof SPECS[0])

const ModelSpec *model_spec_find(const char *name) {
    for (int i = 0; i < N_SPECS; i++)
        if (strcmp(SPECS[i]->name, name) == 0) return SPECS[i];
    return NULL;
}

const ModelSpec *model_spec_require(const char *name, const char *where) {
    const ModelSpec *s = model_spec_find(name);
    if (s) return s;
    char names[256] = "", quoted[160];
    for (int i = 0; i < N_SPECS; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                 SPECS[i]->name);
    die_user("%s: model.name = %s is not implemented yet (models: %s)", where,
             error_quote(quoted, sizeof quoted, name), names);
}

const ModelSpec *model_spec_of_checkpoint(const char *path, Config *trained) {
    char *yaml = ckpt_read_string(path, "config"), err[1024];
    Config c;
    config_defaults(&c);
    // The model's shapes come from it: defaults in its place would describe another model.
    if (!config_parse_text(&c, "attribute config", yaml, strlen(yaml), err, sizeof err))
        die_user("checkpoint %s: %s", path, err);
    free(yaml);
    char where[4096 + 16];
    snprintf(where, sizeof where, "checkpoint %s", path);
    const ModelSpec *spec = model_spec_require(c.model.name, where);
    if (trained) *trained = c;
    else config_free(&c);
    return spec;
}

// The model_type string of dir/config.json, or NULL (no such key, an unreadable file: the
// readers then say why).
static const ModelSpec *spec_of_hf_model_type(const char *dir) {
    char path[4096], err[64];
    json_t *root;
    if (!hf_config_load(dir, &root, path, sizeof path, err, sizeof err)) return NULL;
    const char *type = json_string_value(json_object_get(root, "model_type"));
    const ModelSpec *spec = NULL;
    for (int i = 0; type && i < N_SPECS && !spec; i++)
        for (const char *const *t = SPECS[i]->hf_model_types; t && *t && !spec; t++)
            if (!strcmp(*t, type)) spec = SPECS[i];
    json_decref(root);
    return spec;
}

const ModelSpec *model_spec_of_hf(const char *dir, ModelArgs *a) {
    char why[N_SPECS][1024];
    const ModelSpec *typed = spec_of_hf_model_type(dir);
    if (typed) {
        if (!typed->try_args_from_hf(dir, a, why[0], sizeof why[0])) die_user("%s", why[0]);
        return typed;
    }
    for (int i = 0; i < N_SPECS; i++) {
        why[i][0] = '\0';  // stays empty for an architecture without a Hugging Face format
        bool (*try_args)(const char *, ModelArgs *, char *, size_t) = SPECS[i]->try_args_from_hf;
        if (try_args && try_args(dir, a, why[i], sizeof why[i])) return SPECS[i];
    }
    char all[N_SPECS * 1040] = "";
    for (int i = 0; i < N_SPECS; i++) {
        if (!why[i][0]) continue;
        bool repeated = false;
        for (int j = 0; j < i; j++) repeated |= !strcmp(why[i], why[j]);
        if (!repeated)
            snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", all[0] ? "; " : "",
                     why[i]);
    }
    die_user("%s", all);
}

void model_spec_require_hf(const ModelSpec *spec, const char *what) {
    if (!spec->load_hf)
        die_user("%s: model %s has no Hugging Face format in titan", what, spec->name);
}

const ModelSpec *model_spec_llama2c(void) {
    for (int i = 0; i < N_SPECS; i++)
        if (SPECS[i]->args_from_llama2c) return SPECS[i];
    die_internal(__FILE__, __LINE__, "no architecture reads llama2.c files");
}

void *model_args_fill(ModelArgs *a, const ModelSpec *spec) {
    *a = (ModelArgs){.spec = spec};  // no LoRA until a run asks (ModelArgs.lora)
    return &a->as;
}

const void *model_args_of(const ModelArgs *a, const ModelSpec *spec) {
    CHECK(a->spec == spec);
    return &a->as;
}
