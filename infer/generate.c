// titan generate: continue a prompt one token at a time through the KV cache of the
// checkpoint's architecture (the model registry's decoding; the decoder's:
// models/decoder/decode.c).
//
//   titan generate --checkpoint C [--tokenizer T] (--prompt TEXT | --prompt-ids 1,2,3)
//                  [--chat] [--max-new-tokens 100] [--temperature 0.8] [--top-p 0.9]
//                  [--seed 0] [--max-context N] [--ids] [--ema] [--device cpu|cuda]
//
// C is a titan HDF5 checkpoint (the architecture its stored config names, the model from its
// attributes) or a llama2.c .bin, told apart by the HDF5 signature. With a tokenizer, a text
// prompt is encoded after its BOS (if it has one), the continuation is streamed to stdout as
// text, and EOS ends it (with --chat, the prompt is a user's message in the tokenizer's chat
// template, data/chat.h, and the template's eos_token ends the reply); without one (or with
// --ids) the continuation is printed as space-separated ids. Temperature 0 is greedy (argmax,
// the lowest id on ties); otherwise softmax(logits / t) sampled by nucleus (top-p) with the
// counter-based RNG of --seed, so a seed fixes the output. Prompt plus continuation stay
// within --max-context positions: by default the llama2.c header's seq_len, or 2048
// (torchtitan's default training.seq_len) for a titan checkpoint, whose model attributes do not
// record the length it was trained at. Timing goes to stderr. --ema generates with the
// checkpoint's average of the weights (saved by a run with training.ema_decay) in place of the
// weights. --device cuda keeps the weights and the KV cache in the GPU's memory (loaded through
// host memory, as training's checkpoints are) and brings each step's logits back for the
// sampler; cpu runs the same code, its copies memcpy.
#include "infer/generate.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checkpoint/train_state.h"
#include "core/errors.h"
#include "core/rng.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "models/lora.h"
#include "models/registry.h"

#define USAGE                                                                                  \
    "usage: titan generate --checkpoint C [--tokenizer T] (--prompt TEXT | --prompt-ids 1,2,3) " \
    "[--chat] [--max-new-tokens N] [--temperature t] [--top-p p] [--seed s] [--max-context N] " \
    "[--ids] [--ema] [--device cpu|cuda]"
// --help without a FLUX checkpoint: the decoders' usage and flags, and where FLUX's sampler's
// are.
#define HELP                                                                                   \
    USAGE "\n"                                                                                \
    "       titan generate --checkpoint FLUX.h5 --help   a FLUX checkpoint's sampler flags\n"    \
    "\n"                                                                                      \
    "Flags:\n"                                                                                \
    "  --checkpoint C        a titan HDF5 checkpoint (its stored config names the model) or a\n" \
    "                        llama2.c .bin\n"                                                   \
    "  --tokenizer T         encodes --prompt and prints the continuation as text, EOS ending\n" \
    "                        it: a .tiktoken file, a tokenizer.json, a folder with one, `bytes`\n" \
    "  --prompt TEXT         the prompt as text, after the tokenizer's BOS (needs --tokenizer)\n" \
    "  --prompt-ids 1,2,3    the prompt as token ids (no tokenizer needed)\n"                    \
    "  --chat                --prompt is a user's message, rendered by the tokenizer's chat\n"  \
    "                        template with its generation prompt; the template's eos_token\n"  \
    "                        (an instruct model's end of turn) ends the reply\n"               \
    "  --max-new-tokens N    at most N tokens after the prompt (default 100)\n"                  \
    "  --temperature t       softmax temperature; 0 is greedy, the lowest id on ties (default " \
    "0.8)\n"                                                                                   \
    "  --top-p p             nucleus sampling: draw from the likeliest ids whose probabilities\n" \
    "                        sum to p (default 0.9)\n"                                           \
    "  --seed s              the sampler's random seed: one seed, one output (default 0)\n"      \
    "  --max-context N       prompt plus continuation stay within N positions (default: a\n"   \
    "                        llama2.c file's seq_len, 2048 for a titan checkpoint)\n"            \
    "  --ids                 print the continuation as space-separated ids, even with a\n"       \
    "                        tokenizer\n"                                                        \
    "  --ema                 use the checkpoint's average of the weights (training.ema_decay)\n" \
    "  --device D            cpu (default) or cuda: the weights and KV cache on the GPU\n"      \
    "  -h, --help            this text\n"                                                        \
    "\n"                                                                                      \
    "The continuation goes to stdout and ends with a newline; the summary line (tokens, steps,\n" \
    "tokens/s) goes to stderr."
#define TITAN_DEFAULT_CONTEXT 2048

typedef struct {
    const char *checkpoint, *tokenizer, *prompt, *prompt_ids;
    const char *device;  // the kernels backend: cpu (default) or cuda
    long max_new_tokens, max_context;  // max_context 0: the checkpoint's default
    double temperature, top_p;
    long seed;
    bool print_ids;
    bool ema;   // the average of the weights, not the weights
    bool chat;  // the prompt is a user's message for the chat template (data/chat.h)
} GenOptions;

// ---- options -------------------------------------------------------------------------------

long generate_parse_long(const char *flag, const char *text, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi)
        die_user("%s expects an integer in [%ld, %ld], got '%s'", flag, lo, hi, text);
    return v;
}

double generate_parse_double(const char *flag, const char *text, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v >= lo && v <= hi))
        die_user("%s expects a number in [%g, %g], got '%s'", flag, lo, hi, text);
    return v;
}

const char *generate_need(const char *flag, const char *value) {
    if (!value) die_user("%s needs a value", flag);
    return value;
}

// Sets option f from value (NULL when the command line ended after f); false if f is not an
// option taking a value.
static bool set_option(GenOptions *o, const char *f, const char *value) {
    if (strcmp(f, "--checkpoint") == 0)
        o->checkpoint = generate_need(f, value);
    else if (strcmp(f, "--tokenizer") == 0)
        o->tokenizer = generate_need(f, value);
    else if (strcmp(f, "--prompt") == 0)
        o->prompt = generate_need(f, value);
    else if (strcmp(f, "--prompt-ids") == 0)
        o->prompt_ids = generate_need(f, value);
    else if (strcmp(f, "--max-new-tokens") == 0)
        o->max_new_tokens = generate_parse_long(f, generate_need(f, value), 1, INT32_MAX);
    else if (strcmp(f, "--max-context") == 0)
        o->max_context = generate_parse_long(f, generate_need(f, value), 2, INT32_MAX);
    else if (strcmp(f, "--temperature") == 0)
        o->temperature = generate_parse_double(f, generate_need(f, value), 0, 1e6);
    else if (strcmp(f, "--top-p") == 0)
        o->top_p = generate_parse_double(f, generate_need(f, value), 1e-9, 1);
    else if (strcmp(f, "--seed") == 0)
        o->seed = generate_parse_long(f, generate_need(f, value), 0, LONG_MAX);
    else if (strcmp(f, "--device") == 0)
        o->device = generate_need(f, value);
    else
        return false;
    return true;
}

static void parse_options(GenOptions *o, int argc, char **argv) {
    help_exit_if_asked(argc, argv, HELP);
    *o = (GenOptions){.max_new_tokens = 100, .temperature = 0.8, .top_p = 0.9, .device = "cpu"};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--ids") == 0)
            o->print_ids = true;
        else if (strcmp(argv[i], "--ema") == 0)
            o->ema = true;
        else if (strcmp(argv[i], "--chat") == 0)
            o->chat = true;
        else if (set_option(o, argv[i], i + 1 < argc ? argv[i + 1] : NULL))
            i++;
        else
            die_user("generate: unknown option '%s'; " USAGE, argv[i]);
    }
    if (!o->checkpoint) die_user("generate needs --checkpoint; " USAGE);
    if (!o->prompt == !o->prompt_ids) die_user("generate needs one of --prompt and --prompt-ids");
    if (o->prompt && !o->tokenizer)
        die_user("--prompt needs --tokenizer to encode it (or give token ids with --prompt-ids)");
    if (o->chat && !o->prompt) die_user("--chat needs --prompt (the user's message)");
}

// ---- the prompt ----------------------------------------------------------------------------

typedef struct {
    int32_t *ids;
    size_t n, cap;
} Ids;

static void ids_push(Ids *p, int32_t id) {
    p->ids = xgrow(p->ids, &p->cap, p->n + 1, sizeof(int32_t));
    p->ids[p->n++] = id;
}

// "1,2,3" -> ids.
static void parse_prompt_ids(Ids *p, const char *text) {
    const char *at = text;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(at, &end, 10);
        if (errno || end == at || v < 0 || v > INT32_MAX || (*end && *end != ','))
            die_user("--prompt-ids expects comma-separated token ids like 1,2,3, got '%s'", text);
        ids_push(p, (int32_t)v);
        if (!*end) return;
        at = end + 1;
    }
}

// The user's message in the tokenizer's chat template, up to its generation prompt, tokenized
// as a conversation is for training (data/chat.h); *eos: the template's eos_token's id, which
// ends the reply (the tokenizer's EOS if it is not one token).
static Ids chat_prompt(const GenOptions *o, const Tokenizer *tok, int32_t *eos) {
    char err[1024];
    const json_t *specials;
    const Jinja *tmpl = tokenizer_chat_template(tok, &specials, err, sizeof err);
    if (!tmpl) die_user("--chat: %s", err);
    json_t *line = json_pack("{s:[{s:s, s:s}]}", "messages", "role", "user", "content",
                             o->prompt);
    CHECK(line);
    size_t len, cap = 0;
    char *text = chat_render_prompt(tmpl, specials, line, &len, err, sizeof err);
    json_decref(line);
    if (!text) die_user("--chat: %s", err);
    Ids p = {0};
    p.n = tokenizer_encode_chat(tok, text, len, &p.ids, &cap);
    p.cap = cap;
    free(text);
    const char *eos_text = json_string_value(json_object_get(specials, "eos_token"));
    int32_t *ids = NULL;
    size_t ids_cap = 0;
    *eos = tokenizer_eos_id(tok);
    if (eos_text && tokenizer_encode_chat(tok, eos_text, strlen(eos_text), &ids, &ids_cap) == 1)
        *eos = ids[0];
    free(ids);
    return p;
}

static Ids read_prompt(const GenOptions *o, const Tokenizer *tok) {
    Ids p = {0};
    if (o->prompt_ids) {
        parse_prompt_ids(&p, o->prompt_ids);
        return p;
    }
    if (tokenizer_bos_id(tok) >= 0) ids_push(&p, tokenizer_bos_id(tok));
    int32_t *text = NULL;
    size_t cap = 0, n = tokenizer_encode(tok, o->prompt, strlen(o->prompt), &text, &cap);
    for (size_t i = 0; i < n; i++) ids_push(&p, text[i]);
    free(text);
    if (p.n == 0)
        die_user("--prompt is empty and %s has no BOS token to start from", o->tokenizer);
    return p;
}

// ---- the model -----------------------------------------------------------------------------

typedef struct {
    bool hdf5;           // a titan checkpoint, else a llama2.c .bin
    ModelArgs args;
    Model model;
    Arena weights;
    ArenaMemory memory;  // the backend's, which the weights end up in
} Loaded;

static bool is_hdf5(const char *path) {
    static const char SIGNATURE[8] = "\x89HDF\r\n\x1a\n";
    FILE *f = fopen(path, "rb");
    if (!f) die_user("cannot open checkpoint %s: %s", path, strerror(errno));
    char head[8];
    bool yes = fread(head, 1, sizeof head, f) == sizeof head && !memcmp(head, SIGNATURE, 8);
    fclose(f);
    return yes;
}

static void read_args(Loaded *l, const char *path) {
    l->hdf5 = is_hdf5(path);
    if (l->hdf5) {
        const ModelSpec *spec = model_spec_of_checkpoint(path, NULL);
        spec->args_from_checkpoint(path, &l->args);
        spec->update_from_config(&l->args, NULL, 0, TITAN_DEFAULT_CONTEXT);
    } else {
        model_spec_llama2c()->args_from_llama2c(path, &l->args);
    }
}

void generate_allocate_weights(Model *m, Arena *weights, const ArenaMemory *memory) {
    Arena no_grads;  // generation needs no gradients: sized, never committed
    arena_init_sizing(weights, "params");
    arena_init_sizing(&no_grads, "grads");
    params_allocate(&m->params, weights, &no_grads);
    arena_commit(weights, memory);
    params_allocate(&m->params, weights, &no_grads);
}

void generate_place_weights(Model *m, Arena *weights, ArenaMemory *memory, const KernelOps *k) {
    model_place_buffers(m, k);
    if (k->host_memory) return;
    Arena host = *weights;
    *memory = (ArenaMemory){k->alloc, k->free};
    generate_allocate_weights(m, weights, memory);
    CHECK(weights->used.total == host.used.total);
    k->upload(weights->base, host.base, host.used.total);
    arena_free(&host);
}

const KernelOps *generate_backend(const char *device) {
    const KernelOps *k = kernels_backend(device);
    if (!k && strcmp(device, "cuda") == 0)
        die_user("--device cuda: this titan was built without it (build with `make CUDA=1`)");
    if (!k) die_user("--device expects cpu or cuda, got '%s'", device);
    KernelInit init = {.precision = {.param = DTYPE_FP32, .reduce = DTYPE_FP32}};
    char why[512];
    if (!k->init(&init, why, sizeof why)) die_user("--device %s: %s", device, why);
    return k;
}

// The architectures whose `titan generate` is a command of their own, as they decode no
// tokens (FLUX's image sampler); every other one decodes through its spec's KV cache. The
// table is infer/'s, so that models/ stays below it.
typedef int (*GenerateMain)(int argc, char **argv);  // the whole command, argv[0] "generate"
static const struct {
    const ModelSpec *spec;
    GenerateMain main;
} OWN_GENERATE[] = {
    {&FLUX_SPEC, flux_generate_main},
};

// The generate of checkpoint path's architecture when it has its own, else NULL.
static GenerateMain own_generate(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--checkpoint") && is_hdf5(argv[i + 1])) {
            const ModelSpec *spec = model_spec_of_checkpoint(argv[i + 1], NULL);
            for (size_t j = 0; j < sizeof OWN_GENERATE / sizeof OWN_GENERATE[0]; j++)
                if (OWN_GENERATE[j].spec == spec) return OWN_GENERATE[j].main;
            return NULL;
        }
    return NULL;
}

// Builds the model for n_ctx positions and loads its weights, or their average (ema), with no
// gradient buffers.
static void load_model(Loaded *l, const char *path, int n_ctx, bool ema) {
    const ModelSpec *spec = l->args.spec;
    spec->update_from_config(&l->args, NULL, 0, n_ctx);
    spec->build(&l->model, &l->args, false);
    ParamTable *t = &l->model.params;
    generate_allocate_weights(&l->model, &l->weights, NULL);
    if (ema && !l->hdf5) die_user("--ema: %s is a llama2.c file, which has no average", path);
    if (ema)
        train_state_load_ema(path, t);
    else if (l->hdf5)
        train_state_load(path, t, NULL, NULL);
    else
        spec->load_llama2c(path, &l->model);
    if (!l->hdf5) return;
    Config trained;  // a LoRA run's adapters merge into the weights they adapt
    model_spec_of_checkpoint(path, &trained);
    int merged = lora_merge(path, &trained, t, ema ? "/ema/" : "/model/");
    if (merged) fprintf(stderr, "generate: merged the LoRA adapters of %d weights\n", merged);
    config_free(&trained);
}

// ---- sampling ------------------------------------------------------------------------------

typedef struct {
    float prob;
    int id;
} Candidate;

typedef struct {
    double temperature, top_p;
    uint64_t key;            // draw i of a run is rng_uniform(key, i)
    int n_choices;           // ids [0, n_choices) may be drawn: the model's and tokenizer's
    float *probs;            // (n_choices)
    Candidate *candidates;   // (n_choices)
} Sampler;

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void softmax_with_temperature(float *probs, const float *logits, int n, double t) {
    float mx = logits[argmax(logits, n)];
    double sum = 0;
    for (int i = 0; i < n; i++) sum += probs[i] = expf((float)((logits[i] - mx) / t));
    for (int i = 0; i < n; i++) probs[i] = (float)(probs[i] / sum);
}

// Most probable first; ties by id, so the order (and the draw) is fully determined.
static int candidate_order(const void *pa, const void *pb) {
    const Candidate *a = pa, *b = pb;
    if (a->prob != b->prob) return a->prob > b->prob ? -1 : 1;
    return a->id - b->id;
}

// Nucleus sampling (Holtzman et al. 2019): draw by u from the smallest set of most probable
// ids whose mass exceeds top_p, renormalised. As llama2.c's sample_topp, ids under
// (1 - top_p) / (n - 1) are dropped before sorting: together they weigh less than 1 - top_p,
// so the set is complete before reaching any of them.
static int sample_top_p(Sampler *s, double u) {
    int n = s->n_choices, m = 0;
    double cutoff = n > 1 ? (1.0 - s->top_p) / (n - 1) : 0;
    for (int i = 0; i < n; i++)
        if (s->probs[i] >= cutoff) s->candidates[m++] = (Candidate){s->probs[i], i};
    qsort(s->candidates, (size_t)m, sizeof(Candidate), candidate_order);
    double mass = 0;
    int last = m - 1;
    for (int i = 0; i < m; i++) {
        mass += s->candidates[i].prob;
        if (mass > s->top_p) {
            last = i;
            break;
        }
    }
    double r = u * mass, c = 0;
    for (int i = 0; i < last; i++) {
        c += s->candidates[i].prob;
        if (r < c) return s->candidates[i].id;
    }
    return s->candidates[last].id;
}

static int sampler_next(Sampler *s, const float *logits, uint64_t draw) {
    if (s->temperature == 0) return argmax(logits, s->n_choices);
    softmax_with_temperature(s->probs, logits, s->n_choices, s->temperature);
    return sample_top_p(s, rng_uniform(s->key, draw));
}

// ---- generation ----------------------------------------------------------------------------

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void emit(const Tokenizer *text, int32_t id, int index) {
    if (text) {
        size_t len;
        const char *bytes = tokenizer_token_bytes(text, id, &len);
        fwrite(bytes, 1, len, stdout);
    } else {
        printf(index ? " %d" : "%d", id);
    }
    fflush(stdout);
}

typedef struct {
    int new_tokens, steps;  // tokens generated; tokens run through the model
} GenCount;

// One token through the model; its next-token logits into logits (vocab, host memory).
static void decode(Loaded *l, void *cache, const KernelOps *k, int token, int pos,
                   float *logits) {
    const float *out = l->args.spec->decode_step(&l->model, cache, k, token, pos);
    k->download(logits, out, (size_t)model_shape(&l->args).vocab_size * sizeof(float));
}

// Feeds the prompt, then samples up to max_new tokens, feeding each but the last back; stops
// early at eos (not printed). logits: (vocab) host memory.
static GenCount generate(Loaded *l, void *cache, const KernelOps *k, Sampler *s,
                         const Ids *prompt, int max_new, const Tokenizer *text, int eos,
                         float *logits) {
    GenCount n = {0, 0};
    for (; n.steps < (int)prompt->n; n.steps++)
        decode(l, cache, k, prompt->ids[n.steps], n.steps, logits);
    for (; n.new_tokens < max_new; n.new_tokens++) {
        int next = sampler_next(s, logits, (uint64_t)n.new_tokens);
        if (next == eos) break;
        emit(text, next, n.new_tokens);
        if (n.new_tokens + 1 < max_new) decode(l, cache, k, next, n.steps++, logits);
    }
    putchar('\n');
    fflush(stdout);  // before the summary on stderr, which may go to the same file
    return n;
}

static void check_prompt(const Ids *p, int vocab_size, const char *path, long max_context) {
    for (size_t i = 0; i < p->n; i++)
        if (p->ids[i] >= vocab_size)
            die_user("prompt token %d is outside the vocabulary of %s (%d ids)", p->ids[i], path,
                     vocab_size);
    if ((long)p->n >= max_context)
        die_user("the prompt's %zu tokens leave no room in a context of %ld positions "
                 "(--max-context)", p->n, max_context);
}

int generate_main(int argc, char **argv) {
    GenerateMain own = own_generate(argc, argv);
    if (own) return own(argc, argv);
    GenOptions o;
    parse_options(&o, argc, argv);
    Tokenizer *tok = o.tokenizer ? tokenizer_load(o.tokenizer) : NULL;
    int32_t eos = tok ? tokenizer_eos_id(tok) : -1;
    Ids prompt = o.chat ? chat_prompt(&o, tok, &eos) : read_prompt(&o, tok);
    Loaded l = {0};
    read_args(&l, o.checkpoint);
    const ModelSpec *spec = l.args.spec;
    ModelShape shape = model_shape(&l.args);
    if (tok && tokenizer_vocab_size(tok) > shape.vocab_size)
        die_user("tokenizer %s has %d ids, more than the %d of %s", o.tokenizer,
                 tokenizer_vocab_size(tok), shape.vocab_size, o.checkpoint);
    long max_context = o.max_context ? o.max_context : shape.max_seq_len;
    check_prompt(&prompt, shape.vocab_size, o.checkpoint, max_context);
    long total = (long)prompt.n + o.max_new_tokens;
    int n_ctx = (int)(total < max_context ? total : max_context);
    const KernelOps *k = generate_backend(o.device);
    load_model(&l, o.checkpoint, n_ctx, o.ema);
    generate_place_weights(&l.model, &l.weights, &l.memory, k);

    void *cache = spec->kv_cache_new(&l.model, n_ctx, k);
    float *logits = xmalloc(sizeof(float) * shape.vocab_size);
    int n_choices = tok ? tokenizer_vocab_size(tok) : shape.vocab_size;
    Sampler s = {.temperature = o.temperature, .top_p = o.top_p,
                 .key = rng_key((uint64_t)o.seed, "generate"), .n_choices = n_choices,
                 .probs = xmalloc(sizeof(float) * n_choices),
                 .candidates = xmalloc(sizeof(Candidate) * n_choices)};
    const Tokenizer *text = o.print_ids ? NULL : tok;
    double start = now_seconds();
    GenCount n = generate(&l, cache, k, &s, &prompt, n_ctx - (int)prompt.n, text, eos, logits);
    double seconds = now_seconds() - start;
    fprintf(stderr, "generate: %zu prompt + %d new tokens, %d decode steps in %.3f s (%.1f "
            "tokens/s)\n", prompt.n, n.new_tokens, n.steps, seconds, n.steps / seconds);
    spec->kv_cache_free(cache);
    free(s.probs), free(s.candidates), free(prompt.ids), free(logits);
    arena_free(&l.weights);
    spec->free(&l.model);
    if (tok) tokenizer_free(tok);
    return 0;
}
