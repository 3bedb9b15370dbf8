"""Side by side with Megatron-Bridge 0.3.1 on the same GPU: each row trains once through Bridge's own
pretraining entry point and once through graphbridge, one after the other, each in a fresh process.

    python benchmarks/vs_bridge.py --list
    python benchmarks/vs_bridge.py [ROW ...] [--steps 40] [--work /tmp/vs-bridge] [--json PATH]
    python benchmarks/vs_bridge.py --configs DIR     # each row's Bridge YAML and graphbridge command; no GPU

Bridge's side of a row is a ConfigContainer from Bridge's recipe function (ROWS: the recipe, the shape
set on it, the CUDA-graph impl and scope in Bridge 0.3.1's spelling), run by ``pretrain(config,
forward_step)`` under torchrun with one process. graphbridge's side is that same container, written
with Bridge's ``to_yaml`` and read by ``graphbridge bridge_config=<yaml>``, so every setting graphbridge
has is Bridge's; the row adds only graphbridge's own settings (``ours_only`` rows: what Bridge 0.3.1
cannot do, run on graphbridge alone). Both sides train on graphbridge's mock batches (bridge.data:
Bridge reads them through a DatasetProvider), so the loss curves can be compared step by step; the
token values do not change the step time. LoRA rows put Bridge's LoRA (its defaults) on the container,
packed rows feed both sides the same packed rows; what Bridge's process changes for them is in
benchmarks/bridge_side.py.

Per row it prints the step-time median and p10-p90 of both (the first WARMUP steps, which hold every
capture, left out on both sides; each step timed from a device synchronisation to the next, as
graphbridge's trainer times it), the ratio Bridge / graphbridge (above 1: graphbridge is faster),
the peak allocated memory of both, and whether the losses of the first LOSS_STEPS steps agree
within --tolerance. On the GPU machine: Bridge and what it imports travel as wheels
(scripts/gpu/fetch-bridge-wheels.sh, scripts/gpu/README.md); the Hugging Face configs the recipes
read come from scripts/bridge_fixture.py's offline hub cache.
"""

import argparse
import importlib
import json
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "benchmarks")]
import bridge_fixture  # noqa: E402  (the offline hub cache of the recipes' HF configs)
from bridge_side import same_batches, skip_dataset_helper_build, step_clock, without_base_checkpoint  # noqa: E402
import suite  # noqa: E402  (the commit that ran, as the suite records it)

WARMUP = 4  # steps left out of the timing on both sides: graphs are captured at step 3 (warmup 3) or step 0
LOSS_STEPS = 10
LLAMA_TINY = (("model.num_layers", 8), ("model.hidden_size", 512), ("model.ffn_hidden_size", 1408),
              ("model.num_attention_heads", 8), ("model.num_query_groups", 4), ("model.kv_channels", 64),
              ("model.share_embeddings_and_output_weights", False), ("model.rope_scaling", False),
              ("vocab", 4096), ("seq", 256), ("train.micro_batch_size", 2), ("train.global_batch_size", 2))
LLAMA_TINY_PACKED = (*LLAMA_TINY[:-2], ("train.micro_batch_size", 1), ("train.global_batch_size", 2))
PACKED = ("dataset.packed_sequence=true", "dataset.pad_to_max_length=true")
"""Bridge packs in its dataset, which the row's is not (graphbridge's mock rows, as a DatasetProvider): graphbridge's
side is told with its own keys, padded to seq_length as Bridge's packed SFT data is."""
LLAMA32_1B = (("vocab", 128256), ("train.micro_batch_size", 1), ("train.global_batch_size", 8))
QWEN3_PROXY = (  # Qwen3-30B-A3B's layers on one GPU, as benchmarks/suite.py's moe_proxy shrinks them
    ("model.num_layers", 2), ("model.tensor_model_parallel_size", 1), ("model.pipeline_model_parallel_size", 1),
    ("model.expert_model_parallel_size", 1), ("model.context_parallel_size", 1),
    ("model.virtual_pipeline_model_parallel_size", None), ("model.sequence_parallel", False),
    ("model.pipeline_model_parallel_layout", None), ("model.moe_token_dispatcher_type", "alltoall"),
    ("model.moe_flex_dispatcher_backend", None), ("model.recompute_granularity", None),
    ("model.recompute_method", None), ("model.recompute_num_layers", None),
    ("model.moe_router_force_load_balancing", True),  # Bridge's perf setting for dropless Qwen3
    ("vocab", 151936), ("train.micro_batch_size", 1), ("train.global_batch_size", 4))
LLAMA = ("megatron.bridge.recipes.llama", "llama32_1b_pretrain_config")
QWEN = ("megatron.bridge.recipes.qwen", "qwen3_30b_a3b_pretrain_config")
QWEN_SCOPE = ["attn", "moe_router", "moe_preprocess"]  # Bridge's own Qwen3 graph scope


@dataclass(frozen=True)
class Row:
    description: str
    recipe: Tuple[str, str]
    shape: Tuple[Tuple[str, Any], ...]
    graphs: Tuple[str, Any]
    """Bridge 0.3.1's (model.cuda_graph_impl, model.cuda_graph_scope)."""
    ours_only: Optional[str] = None
    """Why Bridge 0.3.1 cannot run the row; then only graphbridge runs it."""
    extra: Tuple[str, ...] = ()
    """graphbridge overrides beyond the imported file."""
    lora: bool = False
    """Bridge's LoRA with its defaults (rank 32, alpha 32, every attention and MLP linear layer) on the model."""
    packed: bool = False
    """Packed rows (bridge.data's, Bridge's SFT packing) on both sides, one row a micro-batch."""


ROWS: Dict[str, Row] = {
    "llama_tiny_eager": Row("llama/tiny shape, eager", LLAMA, LLAMA_TINY, ("none", "full")),
    "llama_tiny_full_iteration": Row("llama/tiny shape, full-iteration graph", LLAMA, LLAMA_TINY,
                                     ("local", ["full_iteration"])),
    "llama_tiny_te_attn_mlp": Row("llama/tiny shape, TE graphs of attn and mlp", LLAMA, LLAMA_TINY,
                                  ("transformer_engine", ["attn", "mlp"])),
    "llama_tiny_local_layer": Row("llama/tiny shape, megatron-core's local per-layer graphs", LLAMA, LLAMA_TINY,
                                  ("local", "full")),
    "llama_tiny_full_iteration_optimizer": Row(
        "llama/tiny shape, full-iteration graph with the optimizer step inside", LLAMA, LLAMA_TINY,
        ("local", ["full_iteration"]), ours_only="Bridge 0.3.1 steps the optimizer outside the graph",
        # graphbridge's capturable Adam holds unsharded state: no distributed optimizer, hence no param gather.
        extra=("optimizer.optimizer_in_graph=true", "ddp.use_distributed_optimizer=false",
               "ddp.overlap_param_gather=false")),
    "llama_tiny_lora_eager": Row("llama/tiny shape, Bridge's LoRA, eager", LLAMA, LLAMA_TINY, ("none", "full"),
                                 lora=True),
    "llama_tiny_lora_te_attn_mlp": Row("llama/tiny shape, Bridge's LoRA, TE graphs of attn and mlp", LLAMA, LLAMA_TINY,
                                       ("transformer_engine", ["attn", "mlp"]), lora=True),
    # Packed attention takes no graph (packed_sequence_scope): te_mlp is the scope of Bridge's SFT presets.
    "llama_tiny_packed_eager": Row("llama/tiny shape, packed rows, eager", LLAMA, LLAMA_TINY_PACKED, ("none", "full"),
                                   packed=True, extra=PACKED),
    "llama_tiny_packed_te_mlp": Row("llama/tiny shape, packed rows, TE graphs of mlp", LLAMA, LLAMA_TINY_PACKED,
                                    ("transformer_engine", ["mlp"]), packed=True, extra=PACKED),
    "llama32_1b_eager": Row("Llama 3.2 1B, seq 8192, eager", LLAMA, LLAMA32_1B, ("none", "full")),
    "llama32_1b_full_iteration": Row("Llama 3.2 1B, full-iteration graph", LLAMA, LLAMA32_1B,
                                     ("local", ["full_iteration"])),
    "llama32_1b_te_attn_mlp": Row("Llama 3.2 1B, TE graphs of attn and mlp", LLAMA, LLAMA32_1B,
                                  ("transformer_engine", ["attn", "mlp"])),
    "qwen3_proxy_eager": Row("Qwen3-30B-A3B layers, 2 layers, 1 GPU, dropless, eager", QWEN, QWEN3_PROXY,
                             ("none", "full")),
    "qwen3_proxy_te_attn_moe_router": Row("the same, Bridge's Qwen3 scope attn + moe_router + moe_preprocess",
                                          QWEN, QWEN3_PROXY, ("transformer_engine", QWEN_SCOPE)),
}


def bridge_container(row: Row, steps: int):
    """The row's ConfigContainer: Bridge's recipe, the row's shape and graphs, mock data, no checkpoints."""
    from megatron.bridge.training.tokenizers.config import TokenizerConfig

    module, function = row.recipe
    cfg = getattr(importlib.import_module(module), function)()
    shape = dict(row.shape)
    vocab, seq = shape.pop("vocab"), shape.pop("seq", cfg.model.seq_length)
    for dotted, value in shape.items():
        section, name = dotted.split(".")
        setattr(getattr(cfg, section), name, value)
    cfg.model.vocab_size, cfg.tokenizer = vocab, TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=vocab)
    cfg.model.seq_length = cfg.dataset.sequence_length = seq
    cfg.dataset.blend, cfg.dataset.num_workers = None, 2
    # No evaluation: eval_iters=0 builds no valid/test loaders (do_valid/do_test False). eval_interval must
    # stay an int: Bridge's get_train_valid_test_num_samples (data/loaders.py:128) divides by it regardless.
    cfg.train.train_iters, cfg.train.eval_iters, cfg.train.eval_interval = steps, 0, steps
    cfg.scheduler.lr_warmup_iters, cfg.scheduler.lr_decay_iters = steps // 10, steps
    cfg.checkpoint.save = cfg.checkpoint.load = cfg.logger.tensorboard_dir = None
    cfg.logger.log_interval = 1
    impl, scope = row.graphs
    cfg.model.cuda_graph_impl, cfg.model.cuda_graph_scope, cfg.model.cuda_graph_warmup_steps = impl, scope, 3
    # What Bridge's own graph helper sets with an impl: the TE RNG tracker, and no host-side NaN check
    # inside a full-iteration graph.
    cfg.rng.te_rng_tracker = cfg.model.use_te_rng_tracker = impl != "none"
    if scope == ["full_iteration"]:
        cfg.rerun_state_machine.check_for_nan_in_loss = cfg.ddp.check_for_nan_in_grad = False
    if row.lora:
        from megatron.bridge.peft.lora import LoRA

        # Bridge's validate() asks PEFT for a base checkpoint; the worker starts from the seeded init instead
        # (without_base_checkpoint), so this path is never read.
        cfg.peft, cfg.checkpoint.pretrained_checkpoint = LoRA(), "/nonexistent/base-checkpoint"
    return cfg


def graphbridge_overrides(row: Row, yaml_path: Path, steps: int) -> List[str]:
    return [f"bridge_config={yaml_path}", "engine=megatron", f"train.train_iters={steps}",
            f"perf.warmup_steps={WARMUP}", "perf.tensorboard=false", *row.extra]


def write_configs(directory: Path, steps: int, names: List[str]) -> None:
    """Each named row's Bridge YAML and graphbridge command line (Bridge must import; no GPU needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        row = ROWS[name]
        bridge_container(row, steps).to_yaml(str(directory / f"{name}.yaml"))
        record = {"graphbridge": graphbridge_overrides(row, directory / f"{name}.yaml", steps),
                  "bridge_runs": row.ours_only is None, "ours_only": row.ours_only, "graphs": list(row.graphs)}
        (directory / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {len(names)} rows to {directory}")


# --- Bridge's side, in its own torchrun process ------------------------------------------------------------

def run_bridge_worker(name: str, steps: int, out: Path) -> None:
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    skip_dataset_helper_build()
    without_base_checkpoint()
    row = ROWS[name]
    cfg = bridge_container(row, steps)
    cfg.dataset = same_batches(cfg, row.packed)
    clock = step_clock(out / "bridge_result.json")
    pretrain(cfg, forward_step, callbacks=[clock])


# --- both sides of a row, one after the other ------------------------------------------------------------------

def run_row(name: str, steps: int, work: Path) -> dict:
    """Bridge's side (unless ours only), then graphbridge's on the same container, each in a fresh process."""
    from bridge.result import step_time_stats_ms

    row, directory = ROWS[name], work / name
    directory.mkdir(parents=True, exist_ok=True)
    bridge_side = {"status": "ours only", "reason": row.ours_only}
    if row.ours_only is None:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                   str(Path(__file__)), "--bridge-worker", name, "--steps", str(steps), "--work", str(work)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        (directory / "bridge.log").write_text(done.stdout + done.stderr)
        result_path = directory / "bridge_result.json"
        bridge_side = json.loads(result_path.read_text()) if result_path.is_file() else {
            "status": "failed", "reason": (done.stderr.strip().splitlines() or ["no output"])[-1]}
        bridge_side["step_time_ms"] = step_time_stats_ms(bridge_side.get("step_times_s", [])[WARMUP:])
        bridge_side["command"] = " ".join(command)
    overrides = json.loads((work / "configs" / f"{name}.json").read_text())["graphbridge"]
    job = directory / "graphbridge"
    done = subprocess.run([sys.executable, "-m", "perf.main", *overrides, f"hydra.run.dir={job}"], cwd=ROOT,
                          capture_output=True, text=True)
    (directory / "graphbridge.log").write_text(done.stdout + done.stderr)
    ours = json.loads((job / "result.json").read_text()) if (job / "result.json").is_file() else {
        "status": "failed", "reason": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return {"row": name, "description": row.description, "bridge": bridge_side, "graphbridge": ours,
            "graphbridge_command": "graphbridge " + " ".join(overrides)}


def losses_agree(bridge_losses: List[float], our_losses: List[float], tolerance: float) -> Optional[str]:
    """Whether the losses of the first LOSS_STEPS steps agree within ``tolerance`` (relative), with the
    largest difference; None when a side has none."""
    pairs = list(zip(bridge_losses, our_losses))[:LOSS_STEPS]
    if not pairs:
        return None
    worst = max(abs(theirs - ours) / max(abs(ours), 1e-12) for theirs, ours in pairs)
    return f"{'yes' if worst <= tolerance else 'no'} (max {worst:.1%} over {len(pairs)} steps)"


def table(records: List[dict], tolerance: float) -> str:
    lines = ["| row | Bridge median (p10-p90) ms | graphbridge median (p10-p90) ms | ratio | peak GiB Bridge / ours | "
             "trainable Bridge / ours | losses agree |", "|---|---|---|---|---|---|---|"]
    for record in records:
        theirs, ours = record["bridge"], record["graphbridge"]
        their_ms, our_ms = theirs.get("step_time_ms") or {}, ours.get("step_time_ms") or {}
        ratio = their_ms["median"] / our_ms["median"] if their_ms.get("median") and our_ms.get("median") else None
        agree = losses_agree(theirs.get("loss", []), ours.get("loss", []), tolerance)
        our_peak = (ours.get("memory") or {}).get("peak_allocated_gb")
        peak = f"{_number(theirs.get('peak_allocated_gb'))} / {_number(our_peak)}"
        trainable = " / ".join(_trainable(side) for side in (theirs, ours))
        lines.append(f"| {record['row']} | {_timing(theirs, their_ms)} | {_timing(ours, our_ms)} | "
                     f"{_number(ratio, 'x')} | {peak} | {trainable} | {agree or '-'} |")
    return "\n".join(lines)


def _timing(side: dict, stats: dict) -> str:
    if not stats.get("median"):
        return f"{side.get('status', 'missing')}: {side.get('reason') or ''}".strip(": ")
    return f"{stats['median']:.2f} ({stats['p10']:.2f}-{stats['p90']:.2f})"


def _trainable(side: dict) -> str:
    count = (side.get("parameters") or {}).get("trainable")
    return "-" if count is None else f"{count:,}"


def _number(value, unit: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def environment(records: List[dict]) -> dict:
    """GPU and versions: graphbridge's record of its run, and the Bridge that ran."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        bridge_version = version("megatron-bridge")
    except PackageNotFoundError:
        bridge_version = None
    ours = next((record["graphbridge"].get("env") for record in records if record["graphbridge"].get("env")), {})
    return {**ours, "megatron_bridge": bridge_version, "python": platform.python_version()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", help="names from --list (default: all)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--work", type=Path, default=Path("/tmp/vs-bridge"))
    parser.add_argument("--configs", type=Path, metavar="DIR", help="write the rows' configs there and stop")
    parser.add_argument("--tolerance", type=float, default=0.02, help="relative loss difference that still agrees")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--bridge-worker", metavar="ROW", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [name for name in args.rows if name not in ROWS]
    if args.list or unknown:
        for name, row in ROWS.items():
            print(f"{name:38} {'ours only' if row.ours_only else 'both':9} {row.description}")
        return 2 if unknown else 0
    bridge_fixture.write_hub_cache(args.work / "hub")  # the recipes' HF configs, offline
    if args.bridge_worker:
        run_bridge_worker(args.bridge_worker, args.steps, args.work / args.bridge_worker)
        return 0
    if args.configs:
        write_configs(args.configs, args.steps, args.rows or list(ROWS))
        return 0
    subprocess.run([sys.executable, str(Path(__file__)), "--configs", str(args.work / "configs"), "--steps",
                    str(args.steps), "--work", str(args.work), *args.rows], cwd=ROOT, check=True)
    records = []
    for name in args.rows or ROWS:
        records.append(run_row(name, args.steps, args.work))
        if args.json:  # after every row: a machine taken back mid-run keeps the rows it finished
            record = {"command": " ".join(["python benchmarks/vs_bridge.py", *(argv or sys.argv[1:])]),
                      "graphbridge_commit": suite.git_commit(), "date": time.strftime("%Y-%m-%d"),
                      "tolerance": args.tolerance, "steps": args.steps, "warmup_excluded": WARMUP,
                      "environment": environment(records), "rows": records}
            args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(table(records, args.tolerance))
    return 0


if __name__ == "__main__":
    sys.exit(main())
