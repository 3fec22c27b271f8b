// Checks across keys, after every value is read: relations no single key's range expresses,
// values this build does not implement yet, and the float8 converter's settings. Messages name
// each key with its value and where it came from.
#include <inttypes.h>
#include <string.h>

#include "core/config_impl.h"
#include "core/debug_server.h"
#include "core/errors.h"

// Keys of which this build implements only the listed values (as value_format spells them);
// any other value asks for a feature not written yet. Delete a line when its feature lands.
// (model.name is the model registry's to check: models/registry.h.)
typedef struct {
    const char *name;
    const char *accepted[3];
} Implemented;

static const Implemented IMPLEMENTED[] = {
    {"optimizer.name", {"AdamW", "Muon"}},
    {"optimizer.early_step_in_backward", {"false"}},
    {"training.enable_cpu_offload", {"false"}},
    {"training.dtype", {"float32"}},
    {"training.compile", {"false"}},
    {"parallelism.enable_compiled_autograd", {"false"}},
    {"parallelism.enable_async_tensor_parallel", {"false"}},
    {"parallelism.expert_tensor_parallel_degree", {"1"}},
    {"checkpoint.async_mode", {"disabled", "async"}},
    {"checkpoint.load_only", {"false"}},
    {"checkpoint.export_dtype", {"float32", "bfloat16"}},  // no F16 safetensors writer yet
    {"model.print_after_conversion", {"false"}},
    {"metrics.enable_wandb", {"false"}},
};

static const KeySpec *spec_must_find(const char *name) {
    const KeySpec *s = spec_find_full(name);
    if (!s) die_internal(__FILE__, __LINE__, "check table names unknown key '%s'", name);
    return s;
}

// A value as messages show it: strings quoted, control characters escaped.
static void value_show(const Config *c, const KeySpec *s, char *buf, size_t n) {
    char text[512];
    value_format(c, s, text, sizeof text);
    bool quote = (s->type == CONFIG_STRING || s->type == CONFIG_ENUM) &&
                 *(char *const *)field_of_const(c, s);
    if (quote) error_quote(buf, n, text);
    else error_escape(buf, n, text);
}
// "section.key = value (origin)", for a message about how several keys relate.
static const char *setting_describe(const Config *c, const char *name, char *buf, size_t n) {
    const KeySpec *s = spec_must_find(name);
    char value[256], origin[ORIGIN_MAX_LEN];
    value_show(c, s, value, sizeof value);
    origin_of(c, s, origin, sizeof origin);
    snprintf(buf, n, "%s = %s (%s)", name, value, origin);
    return buf;
}

// "origin: section.key = value WHAT", the message about one key's value.
static bool setting_error(const Config *c, const char *name, const char *what, char *err,
                          size_t n) {
    const KeySpec *s = spec_must_find(name);
    char value[256], origin[ORIGIN_MAX_LEN];
    value_show(c, s, value, sizeof value);
    origin_of(c, s, origin, sizeof origin);
    return error_set(err, n, "%s: %s = %s %s", origin, name, value, what);
}

// The trainer indexes a microbatch's tokens (rows of every activation) with an int.
static bool tokens_fit(const Config *c, const char *section, int64_t batch, int64_t len,
                       char *err, size_t n) {
    if (batch * len <= INT32_MAX) return true;  // both are at most INT32_MAX: no overflow
    char b[128], t[128], a[1024], d[1024];
    snprintf(b, sizeof b, "%s.local_batch_size", section);
    snprintf(t, sizeof t, "%s.seq_len", section);
    return error_set(err, n, "%s x %s = %" PRId64 " tokens per microbatch, more than %d",
                     setting_describe(c, b, a, sizeof a), setting_describe(c, t, d, sizeof d),
                     batch * len, INT32_MAX);
}

// The mesh multiplies its degrees in an int (data_parallel_shard_degree -1 is derived).
static bool degrees_fit(const Config *c, char *err, size_t n) {
    static const char *const names[] = {
        "parallelism.pipeline_parallel_degree", "parallelism.data_parallel_replicate_degree",
        "parallelism.data_parallel_shard_degree", "parallelism.context_parallel_degree",
        "parallelism.tensor_parallel_degree"};
    int64_t ranks = 1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int64_t v = *(const int64_t *)field_of_const(c, spec_must_find(names[i]));
        ranks *= v > 0 ? v : 1;  // each at most INT32_MAX and ranks at most INT32_MAX here
        if (ranks <= INT32_MAX) continue;
        char line[4096] = "", one[1024];
        for (size_t j = 0; j <= i; j++) {
            if (*(const int64_t *)field_of_const(c, spec_must_find(names[j])) <= 1) continue;
            size_t used = strlen(line);
            snprintf(line + used, sizeof line - used, "%s%s", used ? " x " : "",
                     setting_describe(c, names[j], one, sizeof one));
        }
        return error_set(err, n, "%s is more than %d ranks", line, INT32_MAX);
    }
    return true;
}

// The debug server's pages carry paths, pids, host names and stack addresses, unauthenticated:
// other hosts see them only when asked for by name.
static bool debug_server_check(const Config *c, char *err, size_t n) {
    const CommSection *cs = &c->comm;
    bool loopback = debug_server_address_is_loopback(cs->debug_server_host);
    if (cs->enable_debug_server && cs->debug_server_allow_remote && loopback)
        return setting_error(c, "comm.debug_server_allow_remote",
                             "does nothing: comm.debug_server_host is a loopback address", err, n);
    if (!cs->enable_debug_server || cs->debug_server_allow_remote || loopback) return true;
    return setting_error(c, "comm.debug_server_host",
                         "lets other hosts read every debug page (paths, pids, host names, "
                         "stacks) without authentication; set comm.debug_server_allow_remote "
                         "to allow that, or listen on 127.0.0.1", err, n);
}

// Relations between keys that no single range expresses.
static bool relations_check(const Config *c, char *err, size_t n) {
    const TrainingSection *t = &c->training;
    char a[1024], b[1024];
    if (t->global_batch_size != -1 && t->global_batch_size % t->local_batch_size != 0)
        return error_set(err, n, "%s must be -1 or a multiple of %s",
                         setting_describe(c, "training.global_batch_size", a, sizeof a),
                         setting_describe(c, "training.local_batch_size", b, sizeof b));
    if (c->checkpoint.keep_latest_k == 1)  // torchtitan's reason: the newest may be being written
        return setting_error(c, "checkpoint.keep_latest_k", "must be 0 (keep all) or at least 2",
                             err, n);
    const CheckpointSection *ck = &c->checkpoint;
    if (ck->last_save_in_hf && !ck->last_save_model_only)  // as torchtitan: weights only
        return error_set(err, n, "%s needs checkpoint.last_save_model_only (a Hugging Face "
                         "checkpoint holds the model only)",
                         setting_describe(c, "checkpoint.last_save_in_hf", a, sizeof a));
    if (strcmp(ck->export_dtype, "float32") != 0 && !ck->last_save_in_hf)
        return error_set(err, n, "%s applies to the Hugging Face export (checkpoint."
                         "last_save_in_hf); titan's HDF5 checkpoints are float32",
                         setting_describe(c, "checkpoint.export_dtype", a, sizeof a));
    const ProfilingSection *pr = &c->profiling;
    if (pr->enable_profiling && pr->profile_freq < pr->profiler_warmup + pr->profiler_active)
        return error_set(err, n, "%s must be at least profiling.profiler_warmup + "
                         "profiling.profiler_active = %lld (torchtitan's profiler schedule)",
                         setting_describe(c, "profiling.profile_freq", a, sizeof a),
                         (long long)(pr->profiler_warmup + pr->profiler_active));
    const ValidationSection *v = &c->validation;
    return tokens_fit(c, "training", t->local_batch_size, t->seq_len, err, n) &&
           tokens_fit(c, "validation", v->local_batch_size, v->seq_len, err, n) &&
           degrees_fit(c, err, n) && debug_server_check(c, err, n);
}

// "... is not implemented yet (implemented: AdamW, Muon)"; a boolean's one value goes unsaid.
static bool not_implemented_error(const Config *c, const Implemented *r, char *err, size_t n) {
    char what[256] = "is not implemented yet";
    if (spec_must_find(r->name)->type != CONFIG_BOOL) {
        size_t used = strlen(what);
        for (size_t j = 0; j < 3 && r->accepted[j] && used < sizeof what; j++)
            used += (size_t)snprintf(what + used, sizeof what - used, "%s%s",
                                     j ? ", " : " (implemented: ", r->accepted[j]);
        if (used < sizeof what) snprintf(what + used, sizeof what - used, ")");
    }
    return setting_error(c, r->name, what, err, n);
}

static bool implemented_check(const Config *c, char *err, size_t n) {
    for (size_t i = 0; i < sizeof IMPLEMENTED / sizeof IMPLEMENTED[0]; i++) {
        const Implemented *r = &IMPLEMENTED[i];
        char text[512];
        value_format(c, spec_must_find(r->name), text, sizeof text);
        bool ok = false;
        for (size_t j = 0; j < 3 && r->accepted[j]; j++) ok = ok || !strcmp(text, r->accepted[j]);
        if (!ok) return not_implemented_error(c, r, err, n);
    }
    return true;
}

bool config_converts(const Config *c, const char *converter) {
    for (int i = 0; i < c->model.converters.count; i++)
        if (!strcmp(c->model.converters.items[i], converter)) return true;
    return false;
}

// True when key s holds a value other than its default (as value_format spells both).
static bool setting_changed(const Config *c, const KeySpec *s) {
    Config d;
    config_defaults(&d);
    char mine[512], def[512];
    value_format(c, s, mine, sizeof mine);
    value_format(&d, s, def, sizeof def);
    config_free(&d);
    return strcmp(mine, def) != 0;
}

// torchtitan's training.dataset and validation.dataset name a registered dataset (c4, c4_test,
// ...); titan has no such registry and reads only the dataset_path beside them, so any other
// value than the default would be ignored.
static bool dataset_names_unused(const Config *c, char *err, size_t n) {
    static const char *const sections[] = {"training", "validation"};
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++) {
        char name[64], what[256];
        snprintf(name, sizeof name, "%s.dataset", sections[i]);
        if (!setting_changed(c, spec_must_find(name))) continue;
        snprintf(what, sizeof what, "does nothing: titan has no named datasets and reads the "
                 "files %s.dataset_path names", sections[i]);
        return setting_error(c, name, what, err, n);
    }
    return true;
}

// Without converter `section` in model.converters every key of that section must keep its
// default: it would do nothing.
static bool converter_keys_unused(const Config *c, const char *section, char *err, size_t n) {
    if (config_converts(c, section)) return true;
    for (size_t i = 0; i < KEY_COUNT; i++)
        if (!strcmp(KEYS[i].section, section) && setting_changed(c, &KEYS[i])) {
            char name[NAME_MAX_LEN + 16], what[128];
            snprintf(name, sizeof name, "%s.%s", section, KEYS[i].key);
            snprintf(what, sizeof what, "does nothing: model.converters has no %s", section);
            return setting_error(c, name, what, err, n);
        }
    return true;
}

// The float8 converter (models/linear.h) as torchtitan's Float8LinearConverter configures it,
// less what is not written yet, refused by name rather than ignored.
static bool float8_check(const Config *c, char *err, size_t n) {
    if (!config_converts(c, "float8")) return converter_keys_unused(c, "float8", err, n);
    const Float8Section *f = &c->float8;
    char a[1024], b[1024];
    // torchao gathers float8 weights for its tensorwise recipe only (torchtitan asserts it);
    // the precomputed scales serve that all-gather and nothing else.
    if (f->enable_fsdp_float8_all_gather && f->recipe_name && strcmp(f->recipe_name, "tensorwise"))
        return error_set(err, n, "%s needs the tensorwise recipe, not %s",
                         setting_describe(c, "float8.enable_fsdp_float8_all_gather", a, sizeof a),
                         setting_describe(c, "float8.recipe_name", b, sizeof b));
    if (f->precompute_float8_dynamic_scale_for_fsdp && !f->enable_fsdp_float8_all_gather)
        return setting_error(c, "float8.precompute_float8_dynamic_scale_for_fsdp",
                             "does nothing without float8.enable_fsdp_float8_all_gather (the "
                             "scales it precomputes are the float8 all-gather's)", err, n);
    if (f->emulate && !strcmp(c->training.device, "cuda"))
        return setting_error(c, "float8.emulate",
                             "is not implemented on training.device cuda (its float8 GEMMs are "
                             "cuBLASLt's; the cpu backend emulates them)", err, n);
    if (c->parallelism.tensor_parallel_degree > 1)
        return error_set(err, n, "%s with %s is not implemented yet (tensor-parallel float8 "
                         "needs the amaxes reduced over the tp group)",
                         setting_describe(c, "model.converters", a, sizeof a),
                         setting_describe(c, "parallelism.tensor_parallel_degree", b, sizeof b));
    bool auto_filter = false;
    for (int i = 0; i < f->filter_fqns.count; i++)
        auto_filter = auto_filter || !strcmp(f->filter_fqns.items[i], "auto_filter_small_kn");
    if (auto_filter && f->recipe_name && !strcmp(f->recipe_name, "rowwise_with_gw_hp"))
        return error_set(err, n, "%s has auto_filter_small_kn, for which torchao has no "
                         "thresholds with %s",
                         setting_describe(c, "float8.filter_fqns", a, sizeof a),
                         setting_describe(c, "float8.recipe_name", b, sizeof b));
    return true;
}

// model.converters: each of titan's converters at most once (torchtitan's others, mx and the
// quantized formats, are not written).
static bool converters_check(const Config *c, char *err, size_t n) {
    const StringList *l = &c->model.converters;
    for (int i = 0; i < l->count; i++) {
        if (strcmp(l->items[i], "float8") != 0 && strcmp(l->items[i], "lora") != 0)
            return setting_error(c, "model.converters",
                                 "is not implemented yet (implemented: float8, lora)", err, n);
        for (int j = 0; j < i; j++)
            if (!strcmp(l->items[i], l->items[j]))
                return setting_error(c, "model.converters", "names a converter twice", err, n);
    }
    return true;
}

// QLoRA's NF4 base is what the adapted Linears' frozen weights compute in; float8 would
// compute them in float8 instead (a float8 base is the float8 converter beside lora).
static bool qlora_check(const Config *c, char *err, size_t n) {
    if (c->lora.quantize_base && config_converts(c, "float8"))
        return setting_error(c, "lora.quantize_base", "holds the base as NF4, which the float8 "
                             "converter would cast to float8 instead: choose one (drop float8 "
                             "from model.converters, or drop lora.quantize_base for a float8 base)",
                             err, n);
    return true;
}

// The first semi_sync key other than method set to other than its default and not one of
// `kept` (names after "semi_sync."), NULL: none.
static const KeySpec *semi_sync_changed(const Config *c, const char *const *kept, int n_kept) {
    for (size_t i = 0; i < KEY_COUNT; i++) {
        bool keep = !strcmp(KEYS[i].key, "method");
        for (int j = 0; j < n_kept; j++) keep = keep || !strcmp(KEYS[i].key, kept[j]);
        if (!strcmp(KEYS[i].section, "semi_sync") && !keep && setting_changed(c, &KEYS[i]))
            return &KEYS[i];
    }
    return NULL;
}

// semi_sync (parallel/semi_sync.h): its keys act on its methods only, the streaming ones on
// streaming_diloco only; the fragments take turns within sync_steps. (That they divide the
// layers is the trainer's to check, with the model.)
static bool semi_sync_check(const Config *c, char *err, size_t n) {
    const SemiSyncSection *s = &c->semi_sync;
    char a[1024], b[1024], name[NAME_MAX_LEN + 16];
    static const char *const OUTER[] = {"sync_steps", "outer_lr", "outer_momentum",
                                        "outer_nesterov"};
    bool none = !strcmp(s->method, "none"), streaming = !strcmp(s->method, "streaming_diloco");
    const KeySpec *stray = none ? semi_sync_changed(c, NULL, 0)
                           : streaming ? NULL
                                       : semi_sync_changed(c, OUTER, 4);
    if (stray) {
        snprintf(name, sizeof name, "semi_sync.%s", stray->key);
        return setting_error(c, name, none ? "does nothing: semi_sync.method is none"
                                           : "is streaming DiLoCo's: set semi_sync.method "
                                             "streaming_diloco", err, n);
    }
    if (none) return true;
    if (c->parallelism.data_parallel_replicate_degree < 2)
        return error_set(err, n, "%s needs replica groups to sync: %s must be at least 2",
                         setting_describe(c, "semi_sync.method", a, sizeof a),
                         setting_describe(c, "parallelism.data_parallel_replicate_degree", b,
                                          sizeof b));
    if (s->sync_steps % s->num_fragments)
        return error_set(err, n, "%s must be a multiple of %s: one fragment syncs every "
                         "sync_steps / num_fragments steps",
                         setting_describe(c, "semi_sync.sync_steps", a, sizeof a),
                         setting_describe(c, "semi_sync.num_fragments", b, sizeof b));
    if (s->fragment_sync_delay >= s->sync_steps / s->num_fragments)
        return error_set(err, n, "%s must be less than sync_steps / num_fragments = %lld: a "
                         "fragment's all-reduce completes before the next one starts",
                         setting_describe(c, "semi_sync.fragment_sync_delay", a, sizeof a),
                         (long long)(s->sync_steps / s->num_fragments));
    return true;
}

// The simulated link between replica groups needs replica groups.
static bool link_check(const Config *c, char *err, size_t n) {
    static const char *const KEYS[] = {"comm.dp_replicate_link_latency_ms",
                                       "comm.dp_replicate_link_gbps"};
    for (int i = 0; i < 2 && c->parallelism.data_parallel_replicate_degree < 2; i++)
        if (setting_changed(c, spec_must_find(KEYS[i])))
            return setting_error(c, KEYS[i], "does nothing: parallelism."
                                 "data_parallel_replicate_degree is 1 (no link between replica "
                                 "groups)", err, n);
    return true;
}

bool config_check_supported(const Config *c, char *err, size_t errlen) {
    return relations_check(c, err, errlen) && implemented_check(c, err, errlen) &&
           dataset_names_unused(c, err, errlen) && converters_check(c, err, errlen) &&
           float8_check(c, err, errlen) && converter_keys_unused(c, "lora", err, errlen) &&
           qlora_check(c, err, errlen) &&
           semi_sync_check(c, err, errlen) && link_check(c, err, errlen);
}
