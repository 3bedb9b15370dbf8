"""What a run reports when its loop ends, on every exit path: result.json (bridge.result builds it)
with the measurements of every rank taken together, and on the terminal a one-screen table and a few
closing lines: what was graphed, what it bought, the next command, the result's path."""

from pathlib import Path
from typing import List, Optional, Tuple

import torch
from rich.console import Console
from rich.table import Table

from bridge.auto.decision import COMPLETED
from bridge.config.graphs import EAGER_CHOICE, compile_mode, graph_impl, is_graphed
from bridge.config.schema import GraphBridgeConfig
from bridge.result import build_result, write_result
from bridge.steps import Steps

NOISY_SPREAD = 2.0
"""p90 over p10 of the timed steps beyond which the run's table calls its step times noisy. The 22 runs
in benchmarks/results (H100s, quiet) spread by 1.49 at most (1.19 in the middle), and graph choices
differ by 1.01x to 1.5x: steps spread wider than 2x come from something else on the machine, and their
median cannot rank graph choices."""


def write_run_result(cfg: GraphBridgeConfig, job_dir: Path, steps: Steps, status: str, reason: Optional[str],
                     ranks_agree: bool, reporting: bool) -> Tuple[dict, Optional[Path]]:
    """The result document, and where it was written (this rank ``reporting``). ``ranks_agree``: every
    rank stopped at the same step boundary, so their measurements can be taken together."""
    engine, record = steps.engine, steps.record
    record.capture_steps = sorted(engine.capture_steps())
    record.graph_count = engine.graph_count()
    if engine.device.type == "cuda":
        try:
            record.peak_allocated_gb = torch.cuda.max_memory_allocated(engine.device) / 2**30
            record.peak_reserved_gb = torch.cuda.max_memory_reserved(engine.device) / 2**30
        except RuntimeError:  # after a sticky CUDA error (illegal address); the result matters more
            pass
    if ranks_agree:
        take_slowest_rank(steps)
    for window in steps.windows():
        try:
            window.stop()
        except RuntimeError as error:  # after a sticky CUDA error; the result matters more
            reason = f"{reason}; the profile was not written: {error}" if reason else str(error)
    record.profiled_steps = sorted({step for window in steps.windows() for step in window.traced_steps})
    result = build_result(cfg, job_dir, status, reason, record)
    if steps.profiler is not None:
        result["profile"] = steps.profiler.summary(result["step_time_ms"]["median"])
    path = write_result(job_dir, result) if reporting else None
    if steps.scalars is not None:
        steps.scalars.close(result)
    return result, path


def take_slowest_rank(steps: Steps) -> None:
    """Under torchrun each step takes as long as its slowest rank, and the job needs the largest peak
    memory: the record keeps the maximum over ranks of each."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1):
        return
    record = steps.record
    measured = record.step_times_s + [record.peak_allocated_gb or 0.0, record.peak_reserved_gb or 0.0]
    slowest = torch.tensor(measured, dtype=torch.float64, device=steps.engine.device)
    torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
    *record.step_times_s, record.peak_allocated_gb, record.peak_reserved_gb = slowest.tolist()


def noise(times: dict) -> Optional[str]:
    """A warning when the timed steps spread beyond NOISY_SPREAD, else None."""
    if times["count"] < 2 or not times["p10"] or times["p90"] / times["p10"] <= NOISY_SPREAD:
        return None
    return (f"NOISY: p90 is {times['p90'] / times['p10']:.1f}x p10 (more than {NOISY_SPREAD:g}x): is something "
            "else running here? Medians this noisy cannot rank graph choices")


def requested(result: dict) -> str:
    """The graph impl the run asked for; under cuda_graph=auto, auto and its choice (the impl is the choice's)."""
    auto = result.get("auto")
    return f"auto (chose {auto['chosen']})" if auto else result["impl"]


def print_summary(result: dict, result_path: Optional[Path]) -> None:
    """One screen: what ran, how fast, how much memory, what was captured; then, on lines of their own (a table
    cell would wrap them), what was graphed, what that bought or why nothing was, the command to try next, and
    the result's path whole, to copy."""
    Console().print(summary_table(result))
    print("\n".join(closing_lines(result, result_path)), flush=True)


def summary_table(result: dict) -> Table:
    """The run's numbers, one row each."""
    def number(value, unit="", digits=1):
        return "n/a" if value is None else f"{value:,.{digits}f}{unit}"

    times, memory, loss = result["step_time_ms"], result["memory"], result["loss"]
    table = Table(title=f"graphbridge run: {result['status']}", show_header=False)
    table.add_column(style="bold", no_wrap=True)  # the labels stay whole; the values take what is left
    table.add_column(overflow="fold")
    rows = [
        ("engine / device", f"{result['engine']} / {result['device']} {result['env']['gpu'] or ''}".strip()),
        ("impl (requested -> effective)",
         f"{requested(result)} -> {result['effective_impl']} {result['modules'] or ''}"),
        ("step time median (p10-p90)",
         f"{number(times['median'], ' ms', 2)} ({number(times['p10'], '', 2)}-{number(times['p90'], ' ms', 2)}), "
         f"{times['count']} steps timed"),
        *([("step time noise", noise(times))] if noise(times) else []),
        ("tokens/s", number(result["tokens_per_s"], "", 0)),
        ("TFLOP/s per GPU", number(result["tflops_per_gpu"], "", 2)),
        ("peak memory allocated / reserved",
         f"{number(memory['peak_allocated_gb'], ' GiB', 2)} / {number(memory['peak_reserved_gb'], ' GiB', 2)}"),
        ("capture", f"step {result['capture_step']}, {number(result['capture_time_s'], ' s', 2)}, "
                    f"{result['graph_count']} graph(s)" if result["capture_step"] is not None else "none"),
        *([("parameters trained", trained_share(result["parameters"]))] if frozen_weights(result) else []),
        ("loss first -> last", f"{loss[0]:.4f} -> {loss[-1]:.4f}" if loss else "n/a"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def frozen_weights(result: dict) -> bool:
    parameters = result.get("parameters")
    return bool(parameters) and parameters["trainable"] < parameters["total"]


def trained_share(parameters: dict) -> str:
    """E.g. "2.0 M of 29.8 M (6.7 %)": under LoRA the adapters against the whole (frozen) model."""
    trainable, total = parameters["trainable"], parameters["total"]
    return f"{trainable / 1e6:.1f} M of {total / 1e6:.1f} M ({100 * trainable / total:.1f} %)"


def closing_lines(result: dict, result_path: Optional[Path]) -> List[str]:
    """What was graphed, auto's speedup where it measured one, why the run trained eagerly where it can say, the
    command to try next, and the result's path alone on the last line."""
    speedup, why = auto_speedup(result), why_eager(result)
    labelled = [("graphed", graphed(result)), *([("speedup", speedup)] if speedup else []),
                *([("why eager", why)] if why else []), ("next", next_command(result))]
    width = len("why eager: ")  # the longest label: the texts start in one column
    return [f"{label + ':':<{width}}{text}" for label, text in labelled] + (
        [str(result_path)] if result_path is not None else [])


def graphed(result: dict) -> str:
    """The graphs the run replayed and their scope, with the choice auto made where it chose; or nothing."""
    impl, auto = result["effective_impl"], result.get("auto")
    mode = compile_mode(impl or "")
    if mode == "reduce-overhead":
        return f"the compiled model's steps, in torch.compile's CUDA graphs (torch_compile={mode})"
    if mode is not None:
        return f"nothing; torch.compile compiled the model without CUDA graphs (torch_compile={mode})"
    if impl is None or not is_graphed(impl):
        return "nothing, the run trained eagerly"
    graph, modules = graph_impl(impl), result["modules"] or []
    scope = f"{', '.join(modules)} of each layer" if graph.unit == "layer" and modules else graph.captures
    how = f"cuda_graph=auto chose {auto['chosen']}" if auto else f"model.cuda_graph_impl={impl}"
    return f"{scope} ({how}; {result['graph_count']} graph(s) captured at step {result['capture_step']})"


def auto_speedup(result: dict) -> Optional[str]:
    """The chosen graph choice's step time against eager's, as cuda_graph=auto's probe measured them (its own,
    or the cached one's); None where it chose eager or measured nothing. Eager's is the one the decision weighed:
    the faster of its two runs, or after a confirming round the mean of its runs, as the chosen's is then."""
    auto = result.get("auto") or {}
    chosen, eager_ms = auto.get("chosen"), auto.get("eager_ms")
    medians = [candidate["median_ms"] for candidate in auto.get("candidates", [])
               if candidate["choice"] == chosen and candidate["status"] == COMPLETED and candidate["median_ms"]]
    if chosen == EAGER_CHOICE or not eager_ms or not medians:
        return None
    chosen_ms = sum(medians) / len(medians)
    probe = "a cached probe" if auto.get("source") == "cache" else "the probe"
    return (f"{eager_ms / chosen_ms:.2f}x eager's speed: {chosen} took {chosen_ms:.2f} ms a step in {probe}, "
            f"eager {eager_ms:.2f} ms")


def why_eager(result: dict) -> Optional[str]:
    """Why nothing was graphed, where the run can tell: no CUDA device, or auto kept eager."""
    auto = result.get("auto")
    if result["device"] != "cuda":
        return (f"graphs need a CUDA device; on one, `{auto_command(result)}` times each graph choice against "
                "eager and trains with the fastest")
    return f"cuda_graph=auto: {auto['reason']}" if auto and auto["chosen"] == EAGER_CHOICE else None


REAL_MODEL_PLAN = "graphbridge mode=plan recipe=llama/llama3_8b gpu=h100 cuda_graph=auto"
"""The step after a run that auto measured, or that could not be: a real model's plan, which any machine makes."""


def next_command(result: dict) -> str:
    """On a GPU, a run that auto did not measure: auto; otherwise a real model's plan."""
    if result["device"] == "cuda" and not result.get("auto"):
        return f"`{auto_command(result)}` times each graph choice against eager and trains with the fastest"
    return f"`{REAL_MODEL_PLAN}` shows what auto would measure for Llama 3 8B on an H100 node"


def auto_command(result: dict) -> str:
    """The run's recipe under cuda_graph=auto."""
    recipe = ((result.get("job") or {}).get("choices") or {}).get("recipe")
    return f"graphbridge recipe={recipe} cuda_graph=auto" if recipe else "graphbridge cuda_graph=auto"
