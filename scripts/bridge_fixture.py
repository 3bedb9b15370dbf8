"""Megatron-Bridge 0.3.1's own recipes as ConfigContainer YAML, recorded for machines without Bridge (CI
runs Python 3.11 without it: Bridge is never needed to install or test graphbridge).

    PYTHONPATH=<Bridge 0.3.1 + its deps> python scripts/bridge_fixture.py            # writes tests/fixtures/bridge/
    PYTHONPATH=... python scripts/bridge_fixture.py --check    # exit 1 when tests/fixtures/bridge/ differs
    PYTHONPATH=... python scripts/bridge_fixture.py --load A.yaml [B.yaml ...]
    PYTHONPATH=... python scripts/bridge_fixture.py --run benchmarks/vs_bridge.py --configs DIR

For each of the four families it calls Bridge's recipe function (RECIPES) and writes what
``ConfigContainer.to_yaml`` writes for the container it returns: the YAML Bridge saves as a run
config and loads with ``ConfigContainer.from_yaml``. tests/test_bridge_config.py imports the
fixtures through the real CLI. ``--load`` hands each file to Bridge's own ``ConfigContainer.from_yaml``
(and ``validate()`` where the config fits one process) and prints, as JSON, ``{file: what to_yaml
writes for the loaded container}``: the test checks that Bridge loads graphbridge's export and that
what it loaded imports back unchanged. ``--run`` runs a script with Bridge importable here (the
stand-ins below installed): how tests build benchmarks/vs_bridge.py's Bridge configs on a CPU.

Bridge on a CPU machine needs three stand-ins, installed here and nowhere in graphbridge:
- Bridge imports GPU-only packages when it is imported (Transformer Engine, mamba_ssm, ...; see
  GPU_ONLY). ``install_cpu_stand_ins`` puts placeholder modules in their place: a name read from
  one is a placeholder class, enough for the imports and class definitions Bridge runs at import
  time. Nothing in them runs: building a recipe's config calls none of them.
- The recipes call ``AutoBridge.from_hf_pretrained(<hub id>)``, which reads the model's config.json
  from the Hugging Face hub. HF_CONFIGS are those files, written here from the models' published
  architecture (the fields the HF-to-Megatron bridges read); ``write_hub_cache`` places them in a
  hub cache read with HF_HUB_OFFLINE=1 (benchmarks/vs_bridge.py uses it on the GPU machine too,
  which has no network either).
- ``apply_flex_dispatcher_backend`` asks torch.cuda which GPU it runs on: the recipes are built as
  on an H100 (compute capability 9.0), so the MoE recipes get the flex dispatcher they get there.
One difference stays: Bridge turns gradient_accumulation_fusion off where apex's fused kernel
(fused_weight_gradient_mlp_cuda) is missing, as it is here.
"""

import argparse
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import runpy
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "bridge"
RECIPES = {  # fixture name -> (module, recipe function)
    "llama3_8b": ("megatron.bridge.recipes.llama", "llama3_8b_pretrain_config"),
    "qwen3_30b_a3b": ("megatron.bridge.recipes.qwen", "qwen3_30b_a3b_pretrain_config"),
    "deepseek_v3": ("megatron.bridge.recipes.deepseek", "deepseek_v3_pretrain_config"),
    "gpt_oss_120b": ("megatron.bridge.recipes.gpt_oss", "gpt_oss_120b_pretrain_config"),
}
GPU_ONLY = ("transformer_engine", "mamba_ssm", "causal_conv1d", "fla", "nvidia_resiliency_ext", "timm",
            "open_clip", "qwen_vl_utils", "wandb", "mlflow", "datasets", "accelerate", "megatron.energon")
STAND_IN_VERSION = "2.10.0"  # what a version check of a stand-in reads (Transformer Engine's tested release)
HF_CONFIGS = {
    "meta-llama/Llama-3.2-1B": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
        "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True, "vocab_size": 128256,
        "initializer_range": 0.02, "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16"},
    "meta-llama/Meta-Llama-3-8B": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "hidden_act": "silu", "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "rope_scaling": None, "attention_bias": False, "tie_word_embeddings": False, "vocab_size": 128256,
        "initializer_range": 0.02, "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16"},
    "Qwen/Qwen3-30B-A3B": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True, "router_aux_loss_coef": 0.001,
        "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "rope_scaling": None, "attention_bias": False, "tie_word_embeddings": False, "vocab_size": 151936,
        "initializer_range": 0.02, "torch_dtype": "bfloat16"},
    "deepseek-ai/DeepSeek-V3": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
        "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
        "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
        "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
        "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
        "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 1, "hidden_act": "silu",
        "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000,
        "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                         "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        "attention_bias": False, "tie_word_embeddings": False, "vocab_size": 129280, "initializer_range": 0.02,
        "torch_dtype": "bfloat16"},
    "openai/gpt-oss-120b": {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
        "intermediate_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "num_local_experts": 128, "num_experts_per_tok": 4, "experts_per_token": 4,
        "router_aux_loss_coef": 0.9, "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 18, "swiglu_limit": 7.0, "hidden_act": "silu",
        "max_position_embeddings": 131072, "initial_context_length": 4096, "rms_norm_eps": 1e-05,
        "rope_theta": 150000,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
        "attention_bias": True, "tie_word_embeddings": False, "vocab_size": 201088, "initializer_range": 0.02,
        "torch_dtype": "bfloat16"},
}


class StandIn(type):
    """A placeholder class: any attribute, call, subscription or union gives a placeholder again."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return StandIn(name, (), {})

    def __call__(cls, *args, **kwargs):
        return cls

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__


class StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = StandIn(name, (), {})
        setattr(self, name, value)
        return value


class StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if any(name == package or name.startswith(f"{package}.") for package in GPU_ONLY):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = StandInModule(spec.name)
        module.__path__, module.__version__ = [], STAND_IN_VERSION
        return module

    def exec_module(self, module):
        pass


def write_hub_cache(hub_cache: Path) -> None:
    """HF_CONFIGS as a Hugging Face hub cache at ``hub_cache``, and the environment that reads it offline."""
    for repo, config in HF_CONFIGS.items():
        snapshot = hub_cache / f"models--{repo.replace('/', '--')}" / "snapshots" / "fixture"
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(json.dumps(config))
        (snapshot.parent.parent / "refs").mkdir(exist_ok=True)
        (snapshot.parent.parent / "refs" / "main").write_text("fixture")
    os.environ.update(HF_HUB_CACHE=str(hub_cache), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def install_cpu_stand_ins() -> None:
    """The GPU-only packages and the H100 of the module docstring; call before importing Bridge."""
    sys.meta_path.insert(0, StandInFinder())
    from megatron.bridge.training import flex_dispatcher_backend

    h100 = types.SimpleNamespace(major=9, minor=0, name="NVIDIA H100 80GB HBM3")
    flex_dispatcher_backend.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_device_properties=lambda device=0: h100))


def recipe_yaml(name: str, scratch: Path) -> str:
    """What Bridge's to_yaml writes for the family's recipe (paths under ``scratch`` made relative)."""
    module, function = RECIPES[name]
    path, here = scratch / f"{name}.yaml", os.getcwd()
    os.chdir(scratch)  # the recipes name their checkpoint and log directories under the working directory
    try:
        getattr(importlib.import_module(module), function)().to_yaml(str(path))
        return path.read_text().replace(f"{os.getcwd()}/", "")
    finally:
        os.chdir(here)


def loaded_yaml(path: Path, scratch: Path) -> str:
    """Bridge's own reading of ``path`` (ConfigContainer.from_yaml), written back by its to_yaml; a config
    that fits one process is validated first (Bridge's ConfigContainer.validate, which pretrain runs),
    so what comes back is the run config Bridge would save."""
    from megatron.bridge.training.config import ConfigContainer

    out, loaded = scratch / f"loaded_{path.name}", ConfigContainer.from_yaml(str(path))
    if loaded.peft is not None and loaded.checkpoint.pretrained_checkpoint is None:
        # A LoRA export's header asks for the base weights' checkpoint, which Bridge's validate requires:
        # given here as a user gives theirs (graphbridge reads no checkpoint field back).
        loaded.checkpoint.pretrained_checkpoint = str(scratch / "base_checkpoint")
    model = loaded.model
    if model.tensor_model_parallel_size * model.pipeline_model_parallel_size * model.context_parallel_size == 1:
        loaded.validate()
    loaded.to_yaml(str(out))
    return out.read_text()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when tests/fixtures/bridge/ differs")
    parser.add_argument("--load", nargs="+", type=Path, metavar="YAML", help="load each with Bridge; print JSON")
    parser.add_argument("--run", nargs=argparse.REMAINDER, metavar="SCRIPT ARGS",
                        help="run a script with Bridge importable on this CPU machine")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        write_hub_cache(scratch / "hub")
        install_cpu_stand_ins()
        if args.run:
            sys.argv = args.run
            runpy.run_path(args.run[0], run_name="__main__")
            return 0
        if args.load:
            print(json.dumps({str(path): loaded_yaml(path.resolve(), scratch) for path in args.load}))
            return 0
        recorded = {name: recipe_yaml(name, scratch) for name in RECIPES}
    stale = [name for name, text in recorded.items()
             if not (FIXTURES / f"{name}.yaml").is_file() or (FIXTURES / f"{name}.yaml").read_text() != text]
    if args.check:
        print(f"stale: {', '.join(stale)}" if stale else "tests/fixtures/bridge/ is current")
        return 1 if stale else 0
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, text in recorded.items():
        (FIXTURES / f"{name}.yaml").write_text(text)
    print(f"wrote {', '.join(f'tests/fixtures/bridge/{name}.yaml' for name in recorded)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
