"""torchtitan 0.3.0 config registry entry for the CPU peer run.

Used as `--module tt_cpu_config --config llama3_debugmodel_cpu` (ConfigManager
imports a fully qualified module when the name is not one of its shorthands).
Starts from torchtitan's own llama3_debugmodel() and changes only what a
CPU side-by-side with titan needs; every field can still be overridden on the
command line (--training.steps 30 etc.).
"""
import os

from torchtitan.models.llama3.config_registry import llama3_debugmodel

# make_assets.sh's folder, which peer_torchtitan.sh names
ASSETS = os.environ["PEER_ASSETS"]


def llama3_debugmodel_cpu():
    c = llama3_debugmodel()
    # tokenizer: HF equivalent of titan's austen BPE (vocab 2046 + BOS/EOS = 2048)
    c.hf_assets_path = os.path.join(ASSETS, "austen_tok")
    # data: austen.txt in 74 documents of 1000 lines (JSONL), via the c4_test loader
    c.dataloader.dataset = "c4_test"
    c.dataloader.dataset_path = os.path.join(ASSETS, "austen_docs")
    c.training.local_batch_size = 8
    c.training.seq_len = 256
    c.training.steps = 30
    # titan's cpu backend computes fp32; torchtitan's default would make FSDP
    # cast params to bf16 for compute
    c.training.mixed_precision_param = "float32"
    c.training.disable_cuda_graphs = True
    # torchtitan's debugmodel defaults to selective AC, which recomputes every second
    # matmul; titan's debug_model.yaml keeps every GEMM's output (its selective op mode
    # recomputes only norms and SwiGLU: about 1% of its step, 50 MiB of activations less)
    c.activation_checkpoint = None
    c.checkpoint.enable = False
    c.validator.enable = False
    c.debug.seed = 0
    return c
