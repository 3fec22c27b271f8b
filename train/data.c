// The trainer's data: the batches' shapes, the tokenizer, the training and validation splits
// (token batches read by data/loader, this rank's columns under context parallel, document ids
// under document masking) and their copies in the backend's memory; or, for an architecture
// that reads its own inputs (its spec's ModelData), that data; and the position a checkpoint
// saves.
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "data/documents.h"
#include "data/tokenize.h"
#include "parallel/cp/layout.h"
#include "train/train.h"

void trainer_shape_batches(Trainer *t) {
    const Config *c = &t->cfg;
    t->train.B = (int)c->training.local_batch_size;
    t->train.T = (int)c->training.seq_len;
    if (c->validation.enable) {
        t->val.B = (int)c->validation.local_batch_size;
        t->val.T = (int)c->validation.seq_len;
    }
    // Each cp rank holds 1/cp of every sequence, in chunks (parallel/cp/layout.h).
    int cp = t->mesh.layout.size[MESH_CP];
    char why[256];
    if (cp > 1 && (cp_layout_check("training.seq_len", t->train.T, cp, why, sizeof why) ||
                   (t->val.B > 0 &&
                    cp_layout_check("validation.seq_len", t->val.T, cp, why, sizeof why))))
        die_user("%s", why);
    t->train.step_T = t->train.T / cp;
    t->val.step_T = t->val.T / cp;
}

void trainer_load_tokenizer(Trainer *t) {
    const Config *c = &t->cfg;
    // --estimate plans with the flavor's vocabulary: it reads no files.
    if (c->model.tokenizer_path && !t->estimate_world_size)
        t->tokenizer = tokenizer_load(c->model.tokenizer_path);
    t->doc_eos = -1;
    if (c->training.document_masking && !t->estimate_world_size) {
        t->doc_eos = t->tokenizer ? tokenizer_eos_id(t->tokenizer) : -1;
        if (t->doc_eos < 0)
            die_user("training.document_masking: documents end at the tokenizer's end-of-text "
                     "token, and %s", t->tokenizer ? "model.tokenizer_path's vocabulary has none"
                                                   : "model.tokenizer_path is not set");
    }
}

// An architecture that reads its own inputs (its spec's ModelData) is checked against the
// run and opens them, which sets the data's shapes in the args (--estimate reads no files: the
// flavor's shapes stand); a sample's rows are then the model's whole sequence (its share under
// context parallel). The token pipeline's data keys are refused by name when the architecture
// reads token batches.
void trainer_open_model_data(Trainer *t) {
    const Config *c = &t->cfg;
    const ModelData *d = t->args.spec->data;
    char why[512];
    if (!d) {
        CHECK(config_key_origin(c, "training.classifier_free_guidance_prob", why, sizeof why));
        if (strcmp(why, "default") != 0)
            die_user("%s: training.classifier_free_guidance_prob does nothing: model %s reads "
                     "token batches", why, c->model.name);
        return;
    }
    if (d->check(c, why, sizeof why)) die_user("%s", why);
    if (!t->estimate_world_size)
        t->data = d->open(c, &t->args, mesh_dp_rank(&t->mesh), mesh_dp_size(&t->mesh.layout),
                          t->train.B);
    t->train.T = model_shape(&t->args).max_seq_len;
    t->train.step_T = d->example_rows(&t->args, t->mesh.layout.size[MESH_CP]);
}

// A supervised dataset's documents (a supervised dataset is tokenized in memory,
// TokenStream.owned, each token's TOKEN_* bits marking the documents' ends), the share of tokens
// the loss trains on, and how many documents are longer than a window. Packing splits every
// document that crosses a window's end, the part in the later window read without the earlier
// (torchtitan's packing; nothing is dropped); those longer than a window are always split.
static void log_examples(const Split *sp) {
    const TokenStream *s = &sp->stream;
    CHECK(s->owned && s->flags);
    int64_t n = token_stream_num_tokens(s), documents = 0, longer = 0, trained = 0, length = 0;
    for (int64_t i = 0; i < n; i++) {
        trained += s->flags[i] & TOKEN_TRAINED;
        length++;
        if (!(s->flags[i] & TOKEN_ENDS_DOCUMENT) && i + 1 < n) continue;
        documents++;
        longer += length > sp->T + 1;
        length = 0;
    }
    log_info("data: %lld documents, %.1f%% of the tokens trained (completions, assistant turns); "
             "%lld longer than a window of %d tokens, split across windows",
             (long long)documents, 100.0 * (double)trained / (double)n, (long long)longer,
             sp->T + 1);
}

// A text dataset needs a tokenizer; a pre-tokenized one (token shards) is read as it is.
static void split_open(Split *sp, const char *key, const char *path, const Tokenizer *tok,
                       const Mesh *mesh, int doc_eos) {
    if (!path) die_user("%s is not set (a text, JSONL or R data file or folder, or token shards)",
                        key);
    if (access(path, R_OK) != 0)
        die_user("%s %s: %s", key, path, strerror(errno));
    if (!tok && !dataset_is_tokenized(path))
        die_user("%s %s is text: set model.tokenizer_path to tokenize it", key, path);
    sp->path = path;
    token_stream_from_dataset(&sp->stream, path, tok);
    log_info("data: %s, %lld tokens", path, (long long)token_stream_num_tokens(&sp->stream));
    if (sp->stream.flags) log_examples(sp);
    loader_open(&sp->loader, &sp->stream, sp->T, mesh_dp_rank(mesh), mesh_dp_size(&mesh->layout),
                sp->B);
    sp->tokens = xmalloc((size_t)sp->B * sp->T * sizeof(int));
    sp->targets = xmalloc((size_t)sp->B * sp->T * sizeof(int));
    if (sp->stream.flags) sp->loss_mask = xmalloc((size_t)sp->B * sp->T * sizeof(int));
    if (sp->stream.flags && doc_eos >= 0)
        sp->doc_ends = xmalloc((size_t)sp->B * sp->T * sizeof(int));
    if (sp->step_T != sp->T) sp->local = xmalloc((size_t)sp->B * sp->step_T * sizeof(int));
    if (doc_eos >= 0) sp->doc = xmalloc((size_t)sp->B * sp->T * sizeof(int));
    // Positions 0, 1, ..., or under context parallel this rank's chunks' (head-tail).
    sp->pos = xmalloc((size_t)sp->step_T * sizeof(int));
    int cp = mesh->layout.size[MESH_CP];
    for (int i = 0; i < sp->step_T; i++) sp->pos[i] = i;
    if (cp > 1) cp_positions(sp->T, cp, mesh->coord[MESH_CP], sp->pos);
}

void trainer_open_data(Trainer *t) {
    const Config *c = &t->cfg;
    split_open(&t->train, "training.dataset_path", c->training.dataset_path, t->tokenizer,
               &t->mesh, t->doc_eos);
    if (c->validation.enable)
        split_open(&t->val, "validation.dataset_path", c->validation.dataset_path, t->tokenizer,
                   &t->mesh, t->doc_eos);
}

// The step's inputs in the backend's memory: each split's token ids and targets, and their
// positions (uploaded once).
void trainer_allocate_inputs(Trainer *t) {
    Arena *a = &t->input_arena;
    Split *splits[] = {&t->train, &t->val};
    arena_init_sizing(a, "inputs");
    for (int pass = 0; pass < 2; pass++) {  // sizing, then carving the committed arena
        if (pass == 1) arena_commit(a, &t->memory);
        if (t->data) {
            t->args.spec->data->carve(t->data, a);
            continue;
        }
        for (int i = 0; i < 2; i++) {
            Split *sp = splits[i];
            size_t ids = (size_t)sp->B * sp->step_T;
            sp->step_tokens = arena_tensor(a, ids, DTYPE_INT32);
            sp->step_targets = arena_tensor(a, ids, DTYPE_INT32);
            sp->step_pos = arena_tensor(a, (size_t)sp->step_T, DTYPE_INT32);
            if (t->doc_eos >= 0)
                sp->step_doc = arena_tensor(a, (size_t)sp->B * sp->T, DTYPE_INT32);
            if (sp->loss_mask) sp->step_loss_mask = arena_tensor(a, ids, DTYPE_INT32);
        }
    }
    for (int i = 0; i < 2 && !t->data; i++) {
        Split *sp = splits[i];
        sp->batch = (TokenBatch){.tokens = sp->step_tokens, .targets = sp->step_targets,
                                 .pos = sp->step_pos, .doc = sp->step_doc,
                                 .loss_mask = sp->step_loss_mask};
        if (sp->B > 0) t->k->upload(sp->step_pos, sp->pos, sp->step_T * sizeof(int));
    }
}

// This rank's columns of a batch (B, T) of the split: full itself, or them in sp->local.
static const int *rank_columns(Split *sp, const int *full) {
    if (sp->step_T == sp->T) return full;
    cp_select(full, sp->B, sp->T, sp->pos, sp->step_T, sp->local);
    return sp->local;
}

// This rank's columns of a batch (B, T) of the split, handed to the backend at dst.
static void upload_columns(const KernelOps *k, Split *sp, int *dst, const int *full) {
    k->upload(dst, rank_columns(sp, full), (size_t)sp->B * sp->step_T * sizeof(int));
}

// The loader's next batch, and under a loss mask the count of this rank's targets that count.
static void split_read(Split *sp) {
    loader_next(&sp->loader, sp->tokens, sp->targets, sp->loss_mask, sp->doc_ends);
    if (!sp->loss_mask) return;
    const int *mine = rank_columns(sp, sp->loss_mask);
    double n = 0;
    for (size_t i = 0; i < (size_t)sp->B * sp->step_T; i++) n += mine[i];
    sp->targets_counted = n;
}

// The split's next batch, checked against the vocabulary (a shard may come from another one),
// then this rank's columns handed to the backend, and the documents of the whole sequences
// when attention is masked by document (doc_eos >= 0).
static void split_next(const KernelOps *k, Split *sp, int vocab_size, int doc_eos) {
    split_read(sp);
    size_t n = (size_t)sp->B * sp->T;
    for (size_t i = 0; i < n; i++) {
        int bad = sp->tokens[i] < 0 || sp->tokens[i] >= vocab_size     ? sp->tokens[i]
                  : sp->targets[i] < 0 || sp->targets[i] >= vocab_size ? sp->targets[i]
                                                                       : 0;
        if (bad != 0)
            die_user("%s: token id %d is outside the model's vocabulary of %d", sp->path, bad,
                     vocab_size);
    }
    upload_columns(k, sp, sp->step_tokens, sp->tokens);
    upload_columns(k, sp, sp->step_targets, sp->targets);
    if (sp->loss_mask) upload_columns(k, sp, sp->step_loss_mask, sp->loss_mask);
    if (doc_eos < 0) return;
    document_ids(sp->tokens, sp->doc_ends, sp->B, sp->T, doc_eos, sp->doc);
    k->upload(sp->step_doc, sp->doc, n * sizeof(int));
}

void trainer_split_next(Trainer *t, Split *sp) {
    split_next(t->k, sp, model_shape(&t->args).vocab_size, t->doc_eos);
}

const void *trainer_next_batch(Trainer *t) {
    if (t->data) return t->args.spec->data->next(t->data, t->k);
    trainer_split_next(t, &t->train);
    return &t->train.batch;
}

void trainer_count_targets(Trainer *t) {
    Split *sp = &t->train;
    if (!sp->loss_mask) return;
    int64_t at = loader_position(&sp->loader);
    double counted = 0;
    for (int mb = 0; mb < t->accum; mb++) {
        split_read(sp);
        counted += sp->targets_counted;
    }
    loader_set_position(&sp->loader, at);
    CommGroup *g = t->mesh.loss;
    t->loss_tokens = comm_all_reduce_double(g, counted, COMM_SUM) / comm_size(g) / t->accum;
}

int64_t trainer_data_position(const Trainer *t) {
    return t->data ? t->args.spec->data->position(t->data) : loader_position(&t->train.loader);
}

void trainer_data_set_position(Trainer *t, int64_t position) {
    if (t->data) t->args.spec->data->set_position(t->data, position);
    else loader_set_position(&t->train.loader, position);
}
