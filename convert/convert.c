// titan convert: a titan checkpoint as a Hugging Face LlamaForCausalLM and back
// (models/llama3/hf.c has the mapping).
//
//   titan convert --to hf [--dtype float32|bfloat16] CHECKPOINT.h5 OUT_DIR
//   titan convert --to titan HF_PATH OUT.h5
//
// To HF: OUT_DIR gets model.safetensors and config.json, whose max_position_embeddings is the
// training.seq_len of the config stored in the checkpoint (titan's RoPE tables are that long).
// To titan: HF_PATH is a folder with config.json and model.safetensors or a sharded index;
// OUT.h5 is a model-only checkpoint as create_seed_checkpoint writes (step 0, no optimizer),
// for checkpoint.initial_load_path, generate and the reference tools, its stored config only
// the training.seq_len HF's max_position_embeddings gives. The weights go through fp32 both
// ways, so titan -> HF (float32) -> titan gives back every tensor bit for bit.
#include "convert/convert.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/train_state.h"
#include "core/config.h"
#include "core/errors.h"
#include "models/llama3/llama3.h"

#define USAGE                                                                                  \
    "usage: titan convert --to hf [--dtype float32|bfloat16] CHECKPOINT.h5 OUT_DIR\n"          \
    "       titan convert --to titan HF_DIR OUT.h5"

typedef struct {
    const char *to, *dtype, *from, *out;
} ConvertOptions;

static void parse_options(ConvertOptions *o, int argc, char **argv) {
    help_exit_if_asked(argc, argv, USAGE);
    *o = (ConvertOptions){.dtype = "float32"};
    const char **positional[] = {&o->from, &o->out};
    int n = 0;
    for (int i = 1; i < argc; i++) {
        bool to = !strcmp(argv[i], "--to"), dtype = !strcmp(argv[i], "--dtype");
        if ((to || dtype) && i + 1 == argc) die_user("%s needs a value", argv[i]);
        if (to || dtype) *(to ? &o->to : &o->dtype) = argv[++i];
        else if (!strncmp(argv[i], "--", 2) || n == 2)
            die_user("convert: unexpected argument '%s'; " USAGE, argv[i]);
        else *positional[n++] = argv[i];
    }
    if (!o->to || n != 2) die_user("convert needs --to and two paths; " USAGE);
    if (strcmp(o->to, "hf") && strcmp(o->to, "titan"))
        die_user("--to expects hf or titan, got '%s'", o->to);
    if (strcmp(o->dtype, "float32") && strcmp(o->dtype, "bfloat16"))
        die_user("--dtype expects float32 or bfloat16, got '%s'", o->dtype);
    if (!strcmp(o->to, "titan") && strcmp(o->dtype, "float32"))
        die_user("--dtype applies to --to hf: titan checkpoints are float32");
}

// The parameter table of args over zeroed host memory (*data, to free with the table).
static void table_build(Model *m, const LlamaArgs *args, ParamTable *params, float **data) {
    llama3_build(m, args, false);
    *data = xcalloc(m->params.numel, sizeof(float));
    params_view(params, &m->params, *data);
}

// training.seq_len of the config stored in a titan checkpoint (torchtitan's 2048 when that
// config does not parse, e.g. written by another version).
static int trained_seq_len(const char *path) {
    char *yaml = ckpt_read_string(path, "config"), err[1024];
    Config c;
    config_defaults(&c);
    int len = config_parse_text(&c, path, yaml, strlen(yaml), err, sizeof err)
                  ? (int)c.training.seq_len : 2048;
    config_free(&c);
    free(yaml);
    return len;
}

static void to_hf(const ConvertOptions *o) {
    LlamaArgs args;
    llama3_args_from_checkpoint(o->from, &args);
    args.max_seq_len = trained_seq_len(o->from);
    Model m;
    ParamTable params;
    float *data;
    table_build(&m, &args, &params, &data);
    train_state_load(o->from, &params, NULL, NULL);
    bool bf16 = !strcmp(o->dtype, "bfloat16");
    llama3_save_hf(o->out, &args, &params, bf16 ? SAFETENSORS_BF16 : SAFETENSORS_F32);
    printf("convert: %s -> %s/model.safetensors (%s) and config.json\n", o->from, o->out,
           o->dtype);
    params_free(&params);
    free(data);
    llama3_free(&m);
}

static void to_titan(const ConvertOptions *o) {
    LlamaArgs args;
    llama3_args_from_hf(o->from, &args);
    Model m;
    ParamTable params;
    float *data;
    table_build(&m, &args, &params, &data);
    llama3_load_hf(o->from, &args, &params);
    CkptAttr attrs[LLAMA3_N_ATTRS];
    int n = llama3_describe(&args, attrs);
    char yaml[256];
    snprintf(yaml, sizeof yaml, "# converted from Hugging Face\ntraining:\n  seq_len: %d\n",
             args.max_seq_len);
    train_state_save(o->out, &params, NULL, (TrainProgress){0, 0}, 0, yaml, attrs, n,
                     MPI_COMM_NULL);
    printf("convert: %s -> %s\n", o->from, o->out);
    params_free(&params);
    free(data);
    llama3_free(&m);
}

int convert_main(int argc, char **argv) {
    ConvertOptions o;
    parse_options(&o, argc, argv);
    if (!strcmp(o.to, "hf")) to_hf(&o);
    else to_titan(&o);
    return 0;
}
