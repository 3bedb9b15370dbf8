"""A Megatron-Bridge 0.3.1 ConfigContainer YAML as graphbridge Hydra overrides.

Bridge uses two kinds of ConfigContainer YAML, and both are read:
- the full container it writes as a run config (``ConfigContainer.to_yaml``: the file named by
  ``logger.save_config_filepath``, the performance scripts' ConfigContainer.yaml, a checkpoint's
  run_config.yaml), with ``_target_`` on the container and on every section, and callables,
  dtypes and enums written as ``_target_`` objects; it loads with ``ConfigContainer.from_yaml``;
- the partial overrides file its example scripts take as ``--config-file`` and merge onto their
  recipe: plain values under some of the container's section names.

Each field graphbridge has a key for (perf.bridge_config_fields) becomes an override of that key,
with the value Bridge would use: ``mixed_precision`` and ``comm_overlap`` laid over the model and
DDP as Bridge's setup lays them. Every other field is ignored and named. What cannot be read (not
YAML, not a mapping, not a ConfigContainer, an unknown enum value or callable in a field graphbridge
reads) raises BridgeConfigError with one line. Values are not judged here: they become explicit
user values, and graphbridge's rule catalogue judges them as it judges any.
"""

import dataclasses
import re
import typing
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bridge.config import resolvers
from bridge.config.migration import legacy_conflict, migrate, scope_names
from bridge.config.schema import CudaGraphImpl, GraphBridgeConfig
from perf.bridge_config_fields import (ACTIVATIONS, COMM_OVERLAP, CUDA_GRAPH, DERIVED, DTYPES, ENUMS, LAYOUT_SYMBOLS,
                                       LORA, LORA_FIELDS, MIXED_PRECISION_RECIPES, PRECISION, RENAMED, YARN,
                                       same_name_keys)
from perf.bridge_config_read import BridgeConfigError, Fields, as_container, plain, planned_for, read_yaml
from perf.workload_map import quoted, value_text

PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
HYDRA_WORDS = ("true", "false", "null", "nan", "inf")
"""Words Hydra's override grammar reads as other than a string."""


class Interpolation(str):
    """A value written as an OmegaConf interpolation (it follows other keys)."""


@dataclass
class Imported:
    overrides: List[str]
    """``key=value`` Hydra overrides, in the schema's order."""
    ignored: List[str]
    """The file's fields graphbridge has no key for, as section.field."""
    planned_for: List[str] = dataclasses.field(default_factory=list)
    """What graphbridge's export planned it for (gpu=, train.num_gpus=), from its comment line."""


def _schema_types(node=GraphBridgeConfig, prefix: str = "") -> Dict[str, Any]:
    types = {}
    for field in dataclasses.fields(node):
        if dataclasses.is_dataclass(field.type):
            types.update(_schema_types(field.type, f"{prefix}{field.name}."))
        else:
            types[f"{prefix}{field.name}"] = field.type
    return types


SCHEMA_TYPES = _schema_types()


def accepts_null(key: str) -> bool:
    kind = SCHEMA_TYPES[key]
    return kind is Any or (typing.get_origin(kind) is typing.Union and type(None) in typing.get_args(kind))


def read_file(path: str) -> Imported:
    """The overrides for the YAML at ``path``; BridgeConfigError says why it cannot be read."""
    try:
        return dataclasses.replace(import_container(read_yaml(path)), planned_for=planned_for(path))
    except BridgeConfigError as error:
        raise BridgeConfigError(f"{path}: {error}") from None


def import_container(data: Any) -> Imported:
    container = as_container(data)
    fields, mapped = Fields(container), {}
    for key in same_name_keys():
        _copy(fields, mapped, key, key)
    for path, key in RENAMED.items():
        _copy(fields, mapped, path, key)
    for part in (_dataset, _model, _schedule, _precision, _comm_overlap, _distributed_optimizer, _graphs,
                 _peft):
        part(fields, mapped)
    _check_types(mapped)
    return Imported(_render(mapped), fields.ignored())


def _check_types(mapped: dict) -> None:
    """A value its key's type cannot hold is a field that cannot be read (one line, not Hydra's report)."""
    schema = OmegaConf.structured(GraphBridgeConfig)
    for key, value in mapped.items():
        if isinstance(value, Interpolation):
            continue
        try:
            OmegaConf.update(schema, key, value, merge=False)
        except OmegaConfBaseException as error:
            raise BridgeConfigError(f"{key}: {value!r} does not fit graphbridge's key "
                                    f"({str(error).splitlines()[0]})") from None


def _copy(fields: Fields, mapped: dict, path: str, key: str) -> None:
    if not fields.has(path) or (fields.peek(path) is None and not accepts_null(key)):
        return  # absent, or null where graphbridge needs a value: graphbridge keeps its own (named as ignored)
    mapped[key] = plain(fields.take(path), path)


def _model(fields: Fields, mapped: dict) -> None:
    if fields.has("model.activation_func"):
        mapped["model.activation_func"] = _activation(fields.take("model.activation_func"))
    _sequence_length(fields, mapped)
    _vocabulary(fields, mapped)
    if fields.has("model.pipeline_model_parallel_layout"):
        mapped["model.pipeline_model_parallel_layout"] = _layout(fields.take("model.pipeline_model_parallel_layout"))
    if fields.has("model.moe_layer_freq"):
        pattern = plain(fields.take("model.moe_layer_freq"), "model.moe_layer_freq")
        mapped["model.moe_layer_freq"] = _layer_pattern(pattern, fields.peek("model.num_layers"))
    _position_embedding(fields, mapped)


def _activation(value: Any) -> str:
    name = ACTIVATIONS.get(value.get("_target_")) if isinstance(value, dict) else value
    if name not in ACTIVATIONS.values():
        shown = value.get("_target_") if isinstance(value, dict) else value
        raise BridgeConfigError(f"model.activation_func: {shown} has no graphbridge equivalent; graphbridge has "
                                f"{', '.join(sorted(set(ACTIVATIONS.values())))}")
    return name


def _sequence_length(fields: Fields, mapped: dict) -> None:
    """graphbridge ties model.seq_length to dataset.seq_length (graphs need one length): the model's
    own value is kept only where it differs, or where the file names no dataset length."""
    if not fields.has("model.seq_length"):
        return
    length = fields.take("model.seq_length")
    if "dataset.seq_length" not in mapped:
        mapped["dataset.seq_length"] = length
    elif length != mapped["dataset.seq_length"]:
        mapped["model.seq_length"] = length


def _vocabulary(fields: Fields, mapped: dict) -> None:
    """Bridge takes a null model.vocab_size from the tokenizer; graphbridge knows it for the NullTokenizer."""
    if fields.peek("model.vocab_size") is not None:
        mapped["model.vocab_size"] = fields.take("model.vocab_size")
    elif fields.has("model.vocab_size") and fields.peek("tokenizer.tokenizer_type") == "NullTokenizer":
        fields.take("model.vocab_size")
        fields.take("tokenizer.tokenizer_type")
        mapped["model.vocab_size"] = fields.take("tokenizer.vocab_size")


def _layout(value: Any) -> Optional[str]:
    """Bridge's stages (lists of layer names) in megatron-core's layout string: Et|tt|tmL."""
    if value is None or isinstance(value, str):
        return value
    stages = plain(value, "model.pipeline_model_parallel_layout")
    if not isinstance(stages, list) or not all(isinstance(stage, list) for stage in stages):
        raise BridgeConfigError("model.pipeline_model_parallel_layout: a layout string or a list of stages, "
                                f"each a list of layer names ({', '.join(LAYOUT_SYMBOLS)})")
    unknown = sorted({repr(name) for stage in stages for name in stage if not isinstance(name, str)
                      or name not in LAYOUT_SYMBOLS})
    if unknown:
        raise BridgeConfigError(f"model.pipeline_model_parallel_layout: unknown layer name(s) {', '.join(unknown)}; "
                                f"Bridge 0.3.1 writes {', '.join(LAYOUT_SYMBOLS)}")
    return "|".join("".join(LAYOUT_SYMBOLS[name] for name in stage) for stage in stages)


def _layer_pattern(value: Any, num_layers: Any) -> Any:
    """k dense layers then MoE, as DeepSeek writes it, follows model.num_layers (graphbridge's
    dense_first resolver), so a smaller proxy of the file keeps its pattern."""
    if not isinstance(value, list) or len(value) != num_layers or not all(bit in (0, 1) for bit in value) \
            or 1 not in value or 0 not in value:
        return value
    dense = value.index(1)
    if value != [0] * dense + [1] * (len(value) - dense):
        return value
    return Interpolation(f"${{graphbridge.dense_first:{dense},${{model.num_layers}}}}")


def _position_embedding(fields: Fields, mapped: dict) -> None:
    """MLA carries YaRN as rope_type (position_embedding_type stays rope); GPTOSSProvider as yarn_* fields.
    graphbridge says yarn in position_embedding_type for both."""
    if fields.peek("model.multi_latent_attention") and fields.has("model.rope_type"):
        fields.take("model.position_embedding_type")
        mapped["model.position_embedding_type"] = "yarn" if fields.take("model.rope_type") == "yarn" else "rope"
    elif fields.has("model.position_embedding_type"):
        mapped["model.position_embedding_type"] = plain(fields.take("model.position_embedding_type"),
                                                        "model.position_embedding_type")
    for name, key in YARN.items():
        _copy(fields, mapped, f"model.{name}", f"model.{key}")


def _dataset(fields: Fields, mapped: dict) -> None:
    """A FinetuningDatasetConfig (SFT, LoRA) names its length seq_length, and packs sequences when its
    packing specs give a size (Bridge's packed_sequence_size > 0), padded when its kwargs say so."""
    _copy(fields, mapped, "dataset.seq_length", "dataset.seq_length")
    specs = fields.peek("dataset.packed_sequence_specs")
    if isinstance(specs, dict):
        size = fields.take("dataset.packed_sequence_specs").get("packed_sequence_size", -1)
        mapped["dataset.packed_sequence"] = isinstance(size, int) and not isinstance(size, bool) and size > 0
    arguments = fields.peek("dataset.dataset_kwargs")
    if isinstance(arguments, dict) and "pad_to_max_length" in arguments:
        mapped["dataset.pad_to_max_length"] = plain(fields.take("dataset.dataset_kwargs")["pad_to_max_length"],
                                                    "dataset.dataset_kwargs.pad_to_max_length")


def _peft(fields: Fields, mapped: dict) -> None:
    """A LoRA object (``peft._target_``) is peft=lora with its fields, by the same names; a null peft is none."""
    if not fields.has("peft"):
        return
    target = fields.peek("peft")
    if target is None:
        mapped["peft.scheme"] = "none"
        return
    kind = target.get("_target_") if isinstance(target, dict) else target
    if kind != LORA:
        raise BridgeConfigError(f"peft: {kind!r} is not a PEFT graphbridge's engines run; they run LoRA ({LORA})")
    mapped["peft.scheme"] = "lora"
    for name in LORA_FIELDS:
        _copy(fields, mapped, f"peft.{name}", f"peft.{name}")


def _schedule(fields: Fields, mapped: dict) -> None:
    """graphbridge warms up from zero for optimizer.lr_warmup_iters, decays to min_lr at train_iters and
    keeps the weight decay constant; Bridge's scheduler fields that say the same are read as that."""
    fraction, decay = fields.peek("scheduler.lr_warmup_fraction"), fields.peek("scheduler.lr_decay_iters")
    iterations = mapped.get("train.train_iters")
    if decay is None or decay == iterations:
        fields.take("scheduler.lr_decay_iters")
    if fields.peek("scheduler.lr_warmup_init") == 0:
        fields.take("scheduler.lr_warmup_init")
    if isinstance(fraction, float) and not fields.peek("scheduler.lr_warmup_iters") and isinstance(
            decay or iterations, int):
        fields.take("scheduler.lr_warmup_fraction")
        mapped["optimizer.lr_warmup_iters"] = int(fraction * (decay or iterations))
    start, end = fields.peek("scheduler.start_weight_decay"), fields.peek("scheduler.end_weight_decay")
    if start is not None and start == end:  # a constant weight decay: the scheduler's, not the optimizer's
        for name in ("start_weight_decay", "end_weight_decay", "weight_decay_incr_style"):
            fields.take(f"scheduler.{name}")
        fields.take("optimizer.weight_decay")
        mapped["optimizer.weight_decay"] = start
    else:
        _copy(fields, mapped, "optimizer.weight_decay", "optimizer.weight_decay")


def _precision(fields: Fields, mapped: dict) -> None:
    """Bridge copies its mixed-precision config onto the model and DDP at setup, so its values win."""
    recipe = fields.peek("mixed_precision")
    if isinstance(recipe, str):
        known = MIXED_PRECISION_RECIPES.get(recipe.replace("-", "_"))
        if known is None:
            raise BridgeConfigError(f"mixed_precision: no recipe '{recipe}' in Bridge 0.3.1 "
                                    f"({', '.join(MIXED_PRECISION_RECIPES)})")
        fields.take("mixed_precision")
        dtype, fp8, fp8_recipe, fp4 = known
        laid = {"bf16": dtype == "bf16", "fp16": dtype == "fp16", "fp8": fp8, "fp8_recipe": fp8_recipe, "fp4": fp4,
                "grad_reduce_in_fp32": dtype == "bf16"}
    elif isinstance(recipe, dict):
        laid = {name: plain(fields.take(f"mixed_precision.{name}"), f"mixed_precision.{name}")
                for name in PRECISION.values() if fields.has(f"mixed_precision.{name}")}
    else:
        laid = {}
    for key, name in PRECISION.items():
        if name in laid:
            fields.take(key)  # replaced by mixed_precision at setup
            mapped[key] = laid[name]
        else:
            _copy(fields, mapped, key, key)
    _agreeing_dtypes(fields, mapped)


def _agreeing_dtypes(fields: Fields, mapped: dict) -> None:
    """graphbridge derives the parameter and pipeline dtypes, and the optimizer's bf16/fp16, from
    model.bf16/fp16: the file's values that agree with that derivation are read as it."""
    if "model.bf16" not in mapped or "model.fp16" not in mapped:
        return
    dtype = "bf16" if mapped["model.bf16"] else "fp16" if mapped["model.fp16"] else "fp32"
    for path in ("model.params_dtype", "model.pipeline_dtype", "mixed_precision.params_dtype",
                 "mixed_precision.pipeline_dtype"):
        value = fields.peek(path)
        if isinstance(value, dict) and DTYPES.get(value.get("_target_")) == dtype:
            fields.take(path)
    for name in ("bf16", "fp16"):
        if fields.peek(f"optimizer.{name}") == mapped[f"model.{name}"]:
            fields.take(f"optimizer.{name}")


def _comm_overlap(fields: Fields, mapped: dict) -> None:
    """A CommOverlapConfig sets the model's overlap switches (off unless it turns them on), and the DDP and
    optimizer ones it names; without one, the sections' own values stand."""
    overlap = fields.peek("comm_overlap")
    for key, (name, when_null) in COMM_OVERLAP.items():
        value = fields.take(f"comm_overlap.{name}") if isinstance(overlap, dict) else None
        if value is None:
            value = when_null if isinstance(overlap, dict) else None
        if value is None:
            _copy(fields, mapped, key, key)
        else:
            fields.take(key)
            mapped[key] = plain(value, f"comm_overlap.{name}")
    data_parallel = fields.take("comm_overlap.data_parallel_size") if isinstance(overlap, dict) else None
    if data_parallel is not None:  # Bridge records it at validation: the GPUs are the model-parallel ranks times it
        splits = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")
        sizes = [data_parallel] + [fields.peek(f"model.{name}", 1) for name in splits]
        if not all(isinstance(size, int) and not isinstance(size, bool) and size > 0 for size in sizes):
            raise BridgeConfigError(f"comm_overlap.data_parallel_size={data_parallel!r} with the model's parallel "
                                    f"sizes {sizes[1:]}: the GPU count needs whole numbers")
        mapped["train.num_gpus"] = sizes[0] * sizes[1] * sizes[2] * sizes[3]


def _distributed_optimizer(fields: Fields, mapped: dict) -> None:
    """Bridge turns the distributed optimizer on for both sections when either asks for it."""
    values = [plain(fields.take(path), path) for path in ("ddp.use_distributed_optimizer",
                                                          "optimizer.use_distributed_optimizer")
              if fields.peek(path) is not None]
    if values:
        mapped["ddp.use_distributed_optimizer"] = any(values)


def _graphs(fields: Fields, mapped: dict) -> None:
    """megatron-core 0.16.1's impl + scope (and its deprecated flags) as graphbridge's impl + modules,
    by graphbridge's own migration; the derived keys where the file departs from their derivation."""
    impl = None
    if any(fields.has(path) for path in CUDA_GRAPH):
        impl = _graph_impl(fields, mapped)
    trackers = [path for path in ("rng.te_rng_tracker", "model.use_te_rng_tracker") if fields.has(path)]
    for key, resolver in DERIVED.items():
        if key == "rng.te_rng_tracker" and trackers:
            # Bridge turns both trackers on when either is; graphbridge's model key follows rng's. Each is
            # read (a list, not a generator any() would stop early), so neither is named as ignored.
            value = any([plain(fields.take(path), path) for path in trackers])
        elif key in trackers or not fields.has(key):
            continue
        else:
            value = plain(fields.take(key), key)
        if impl is None or value != getattr(resolvers, resolver)(impl):
            mapped[key] = value


def _graph_impl(fields: Fields, mapped: dict) -> CudaGraphImpl:
    text = fields.take("model.cuda_graph_impl", "none")
    if not isinstance(text, str) or text not in {impl.value for impl in CudaGraphImpl}:
        raise BridgeConfigError(f"model.cuda_graph_impl: unknown value {text!r} (Bridge 0.3.1: none, local, "
                                "transformer_engine)")
    scope = _scope(fields.take("model.cuda_graph_scope"))
    if scope is not None and not isinstance(scope, (str, list)):
        raise BridgeConfigError(f"model.cuda_graph_scope: {scope!r} is neither a scope name nor a list of them")
    names = scope_names(scope)
    model = SimpleNamespace(cuda_graph_impl=CudaGraphImpl(text), cuda_graph_scope=names or None,
                            cuda_graph_modules=[], inference_cuda_graph_scope=None,
                            enable_cuda_graph=bool(fields.take("model.enable_cuda_graph", False)),
                            external_cuda_graph=bool(fields.take("model.external_cuda_graph", False)))
    if legacy_conflict(model) is None:
        migrate(model)
    mapped["model.cuda_graph_impl"] = CudaGraphImpl(model.cuda_graph_impl).value
    mapped["model.cuda_graph_modules"] = list(model.cuda_graph_modules)
    parked = scope_names(model.cuda_graph_scope)
    if parked not in ([], ["full"]):  # inert behind impl none (as in 0.16.1), or refused by the catalogue
        mapped["model.cuda_graph_scope"] = parked
    for flag in ("enable_cuda_graph", "external_cuda_graph"):
        if getattr(model, flag):
            mapped[f"model.{flag}"] = True
    return CudaGraphImpl(model.cuda_graph_impl)


def _scope(value: Any) -> Any:
    """cuda_graph_scope as names: a name, a comma string, or a list of names or CudaGraphScope objects."""
    if isinstance(value, list):
        return [_scope_name(item) for item in value]
    return _scope_name(value) if isinstance(value, dict) else value


def _scope_name(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    members, arguments = ENUMS.get(value.get("_target_")), value.get("_args_") or [None]
    if members is None:
        raise BridgeConfigError(f"model.cuda_graph_scope: {value.get('_target_')} is not a CudaGraphScope")
    if arguments[0] not in members:
        raise BridgeConfigError(f"model.cuda_graph_scope: CudaGraphScope({arguments[0]!r}) is no member of "
                                f"megatron-core 0.16.1's CudaGraphScope ({', '.join(map(str, members))})")
    return members[arguments[0]]


def _render(mapped: dict) -> List[str]:
    order = list(SCHEMA_TYPES)
    return [f"{key}={_text(mapped[key])}" for key in sorted(mapped, key=order.index)]


def _text(value: Any) -> str:
    """Hydra's override text; a plain name stays unquoted, so the printed command line reads as typed."""
    if isinstance(value, Interpolation):
        return quoted(value, literal_text=False)
    if isinstance(value, list):
        return "[" + ",".join(_text(item) for item in value) + "]"
    if isinstance(value, str) and PLAIN_NAME.fullmatch(value) and value.lower() not in HYDRA_WORDS:
        return value
    return value_text(value)
