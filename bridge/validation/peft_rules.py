"""LoRA (``peft=lora``): which layers graphbridge's engines can give an adapter, and how an adapter splits over
tensor parallelism (bridge/engines/megatron/lora.py, bridge/engines/torch/lora.py)."""

from bridge.config.model_facts import has_moe_layers
from bridge.config.peft import COLUMN_PARALLEL_TARGETS, lora_targets
from bridge.config.schema import LoraTarget
from bridge.validation.registry import rule, violation

TARGETS = "peft.target_modules"


@rule("lora_targets",
      rejects="`peft=lora` with no target, or with targets the model lacks or graphbridge's engines do not adapt: "
              "linear_qkv of multi-latent attention, the MLP layers of a model with routed experts",
      fix="`peft.target_modules` the message lists, or `peft=none`")
def lora_targets_rule(cfg, target):
    targets = lora_targets(cfg.peft)
    if targets is None:
        return None
    model, missing = cfg.model, []
    if not targets:
        return violation("lora_targets", [TARGETS], "peft.target_modules is empty, so LoRA would train nothing; set "
                                                    "peft.target_modules=[linear_qkv,linear_proj], or peft=none")
    if model.multi_latent_attention and LoraTarget.linear_qkv.value in targets:
        missing.append(("linear_qkv", "multi-latent attention (model.multi_latent_attention) projects through "
                                      "linear_q_proj and linear_kv_down_proj, which take no adapter here"))
    if has_moe_layers(model):
        missing += [(name, "graphbridge's engines adapt no routed expert, and this model has MoE layers")
                    for name in ("linear_fc1", "linear_fc2") if name in targets]
    if not missing:
        return None
    kept = [name for name in targets if name not in dict(missing)] or [
        name for name in ("linear_proj", "linear_qkv") if name not in dict(missing)]
    return violation("lora_targets", [TARGETS] + (["model.multi_latent_attention"] if model.multi_latent_attention
                                                  else []),
                     f"{'; '.join(f'{name}: {why}' for name, why in missing)}; set "
                     f"peft.target_modules=[{','.join(kept)}]")


@rule("lora_rank_tensor_parallel", engine="megatron",
      rejects="a LoRA rank that tensor parallelism does not divide, with a column-parallel target "
              "(linear_qkv, linear_fc1: the adapter's down-projection splits its rank over the TP ranks)",
      fix="`peft.dim` a multiple of `model.tensor_model_parallel_size`")
def lora_rank_tensor_parallel(cfg, target):
    targets, tp = lora_targets(cfg.peft), cfg.model.tensor_model_parallel_size
    if not targets or tp < 1 or cfg.peft.dim < 1 or cfg.peft.dim % tp == 0:
        return None
    split = [name for name in targets if name in COLUMN_PARALLEL_TARGETS]
    if not split:
        return None
    fitting = (cfg.peft.dim // tp + 1) * tp
    return violation("lora_rank_tensor_parallel", ["peft.dim", "model.tensor_model_parallel_size"],
                     f"the adapters of {' and '.join(split)} split their rank peft.dim={cfg.peft.dim} over "
                     f"model.tensor_model_parallel_size={tp}, which does not divide it; set peft.dim={fitting}")
