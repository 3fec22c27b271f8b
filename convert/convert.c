// titan convert: a titan checkpoint as a Hugging Face model and back, through the model
// registry (llama3 and qwen3: models/decoder/hf.c has the mapping).
//
//   titan convert --to hf [--dtype float32|bfloat16] [--ema] [--mtp] [--tokenizer PATH]
//                         CHECKPOINT.h5 OUT_DIR
//   titan convert --to titan HF_PATH OUT.h5
//   titan convert --to peft [--ema] CHECKPOINT.h5 OUT_DIR
//
// To HF: OUT_DIR gets model.safetensors and config.json, whose max_position_embeddings is the
// training.seq_len of the config stored in the checkpoint (titan's RoPE tables are that long);
// with --ema, its weights are the checkpoint's average of them (training.ema_decay); with
// --mtp, DeepSeek-V3's multi-token prediction modules go too, as DeepSeek's release has them
// (transformers drops them otherwise, and so does the export). The
// tokenizer (--tokenizer, else the stored config's model.tokenizer_path where it exists) adds
// tokenizer.json, tokenizer_config.json, generation_config.json and config.json's BOS/EOS ids
// (convert/hf_tokenizer.c).
// To titan: HF_PATH is a folder with config.json and model.safetensors or a sharded index;
// OUT.h5 is a model-only checkpoint (with the MTP modules a DeepSeek-V3 release holds) as
// create_seed_checkpoint writes (step 0, no optimizer), for checkpoint.initial_load_path,
// generate and the reference tools, its stored config only the model.name of the
// architecture whose reader takes the folder and the training.seq_len HF's
// max_position_embeddings gives. The weights go through fp32 both ways, so titan -> HF
// (float32) -> titan gives back every tensor bit for bit.
// To PEFT: a LoRA run's adapters as PEFT's adapter_model.safetensors and adapter_config.json,
// for `PeftModel.from_pretrained` on the base model (its weights in the checkpoint are the
// base's, unchanged; --to hf exports them with the adapters merged).
#include "convert/convert.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/train_state.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/host_memory.h"
#include "models/lora.h"
#include "models/registry.h"

#define USAGE                                                                                  \
    "usage: titan convert --to hf [--dtype float32|bfloat16] [--ema] [--mtp] [--tokenizer PATH]\n" \
    "                         CHECKPOINT.h5 OUT_DIR\n"                                          \
    "       titan convert --to titan HF_DIR OUT.h5\n"                                        \
    "       titan convert --to peft [--ema] CHECKPOINT.h5 OUT_DIR"

typedef struct {
    const char *to, *dtype, *from, *out;
    const char *tokenizer;  // --to hf: NULL for the checkpoint's model.tokenizer_path
    bool ema;  // --to hf: the average of the weights, not the weights
    bool mtp;  // --to hf: the multi-token prediction modules too
} ConvertOptions;

static void parse_options(ConvertOptions *o, int argc, char **argv) {
    help_exit_if_asked(argc, argv, USAGE);
    *o = (ConvertOptions){.dtype = "float32"};
    const char **positional[] = {&o->from, &o->out};
    int n = 0;
    for (int i = 1; i < argc; i++) {
        bool to = !strcmp(argv[i], "--to"), dtype = !strcmp(argv[i], "--dtype"),
             tok = !strcmp(argv[i], "--tokenizer");
        if ((to || dtype || tok) && i + 1 == argc) die_user("%s needs a value", argv[i]);
        if (to || dtype || tok) *(to ? &o->to : dtype ? &o->dtype : &o->tokenizer) = argv[++i];
        else if (!strcmp(argv[i], "--ema")) o->ema = true;
        else if (!strcmp(argv[i], "--mtp")) o->mtp = true;
        else if (!strncmp(argv[i], "--", 2) || n == 2)
            die_user("convert: unexpected argument '%s'; " USAGE, argv[i]);
        else *positional[n++] = argv[i];
    }
    if (!o->to || n != 2) die_user("convert needs --to and two paths; " USAGE);
    if (strcmp(o->to, "hf") && strcmp(o->to, "titan") && strcmp(o->to, "peft"))
        die_user("--to expects hf, titan or peft, got '%s'", o->to);
    if (!strcmp(o->to, "peft") && (strcmp(o->dtype, "float32") || o->mtp || o->tokenizer))
        die_user("--to peft takes --ema only: PEFT's adapter is float32 LoRA matrices");
    if (strcmp(o->dtype, "float32") && strcmp(o->dtype, "bfloat16"))
        die_user("--dtype expects float32 or bfloat16, got '%s'", o->dtype);
    if (!strcmp(o->to, "titan") && strcmp(o->dtype, "float32"))
        die_user("--dtype applies to --to hf: titan checkpoints are float32");
    if (!strcmp(o->to, "titan") && o->ema)
        die_user("--ema applies to --to hf: a Hugging Face folder has no average of the weights");
    if (!strcmp(o->to, "titan") && o->mtp)
        die_user("--mtp applies to --to hf: an import takes the MTP modules the weights hold");
    if (!strcmp(o->to, "titan") && o->tokenizer)
        die_user("--tokenizer applies to --to hf: titan checkpoints hold no tokenizer");
    if (o->tokenizer && strcmp(o->tokenizer, "bytes") && access(o->tokenizer, R_OK) != 0)
        die_user("--tokenizer %s: %s", o->tokenizer, strerror(errno));
}

// The parameter table of args over zeroed host memory (*data, to free with the table), which
// must fit the host's free memory.
static void table_build(Model *m, const ModelArgs *args, ParamTable *params, float **data) {
    args->spec->build(m, args, false);
    double need = (double)m->params.numel * sizeof(float), room = (double)host_memory_free();
    if (need > room)
        die_user("convert: the model's %.3g parameters need %.2f GiB of host memory in fp32, but "
                 "%.2f GiB is free", (double)m->params.numel, need / 1073741824.0,
                 room / 1073741824.0);
    *data = xcalloc(m->params.numel, sizeof(float));
    params_view(params, &m->params, *data, NULL);
}

static void to_hf(const ConvertOptions *o) {
    Config trained;
    const ModelSpec *spec = model_spec_of_checkpoint(o->from, &trained);
    model_spec_require_hf(spec, "convert --to hf");
    ModelArgs args;
    spec->args_from_checkpoint(o->from, &args);
    spec->update_from_config(&args, NULL, 0, (int)trained.training.seq_len);
    if (o->mtp && model_shape(&args).mtp_layers == 0)
        die_user("--mtp: checkpoint %s has no multi-token prediction modules", o->from);
    const char *path = o->tokenizer ? o->tokenizer : trained.model.tokenizer_path;
    char tokenizer[4096];
    if (path) CHECK(snprintf(tokenizer, sizeof tokenizer, "%s", path) < (int)sizeof tokenizer);
    Model m;
    ParamTable params;
    float *data;
    table_build(&m, &args, &params, &data);
    if (o->ema) train_state_load_ema(o->from, &params);
    else train_state_load(o->from, &params, NULL, NULL);
    int merged = lora_merge(o->from, &trained, &params, o->ema ? "/ema/" : "/model/");
    config_free(&trained);
    bool bf16 = !strcmp(o->dtype, "bfloat16");
    spec->save_hf(o->out, &args, &params,
                  (HfExport){bf16 ? SAFETENSORS_BF16 : SAFETENSORS_F32, o->mtp});
    char note[1024];
    convert_hf_tokenizer(path ? tokenizer : NULL, o->out, note, sizeof note);
    printf("convert: %s -> %s/model.safetensors (%s%s), config.json and %s\n", o->from, o->out,
           o->dtype, merged ? ", the LoRA adapters merged" : "", note);
    params_free(&params);
    free(data);
    spec->free(&m);
}

static void to_titan(const ConvertOptions *o) {
    ModelArgs args;
    const ModelSpec *spec = model_spec_of_hf(o->from, &args);
    Model m;
    ParamTable params;
    float *data;
    table_build(&m, &args, &params, &data);
    spec->load_hf(o->from, &args, &params);
    CkptAttr attrs[MODEL_MAX_ATTRS];
    int n = spec->describe(&args, attrs);
    char yaml[256];
    snprintf(yaml, sizeof yaml, "# converted from Hugging Face\nmodel:\n  name: %s\ntraining:\n"
             "  seq_len: %d\n", spec->name, model_shape(&args).max_seq_len);
    train_state_save(o->out, &params, NULL, (TrainProgress){0, 0}, 0, yaml, attrs, n,
                     MPI_COMM_NULL);
    printf("convert: %s -> %s\n", o->from, o->out);
    params_free(&params);
    free(data);
    spec->free(&m);
}

static bool is_adapter(const Param *p) { return lora_adapter_of(p->name, NULL, 0, NULL); }

// Reads the adapters only: the base's weights stay on disk, whatever their size.
static void to_peft(const ConvertOptions *o) {
    Config trained;
    const ModelSpec *spec = model_spec_of_checkpoint(o->from, &trained);
    if (!config_converts(&trained, "lora"))
        die_user("convert --to peft: checkpoint %s is not a LoRA run's (its model.converters "
                 "has no lora)", o->from);
    CHECK(spec->save_peft);  // a spec that builds adapters exports them
    ModelArgs args;
    spec->args_from_checkpoint(o->from, &args);
    spec->update_from_config(&args, NULL, 0, (int)trained.training.seq_len);
    args.lora = &trained.lora;  // the table with the adapters, to read them
    Model m;
    spec->build(&m, &args, false);
    ParamTable adapters, global;  // the adapters alone, whole, in host memory
    params_select(&adapters, &m.params, is_adapter);
    params_global_view(&global, &adapters);
    if (o->ema) train_state_load_ema(o->from, &global);
    else train_state_load(o->from, &global, NULL, NULL);
    spec->save_peft(o->out, &args, &global, &trained.lora);
    printf("convert: %s -> %s/adapter_model.safetensors and adapter_config.json (rank %lld, "
           "alpha %g)\n", o->from, o->out, (long long)trained.lora.rank, trained.lora.alpha);
    config_free(&trained);
    free(global.data);
    params_free(&global);
    params_free(&adapters);
    spec->free(&m);
}

int convert_main(int argc, char **argv) {
    ConvertOptions o;
    parse_options(&o, argc, argv);
    if (!strcmp(o.to, "hf")) to_hf(&o);
    else if (!strcmp(o.to, "peft")) to_peft(&o);
    else to_titan(&o);
    return 0;
}
