"""The one vocabulary of CUDA-graph implementations: for each ``model.cuda_graph_impl``, what is
captured, when, and by which mechanism in each engine.

The planner describes a job with it, the translation picks megatron-core's spelling from it, the
engines pick their graph lifecycle from it, the rules and the report ask it whether a job is
graphed: every layer asks this table instead of branching on the impl itself.
"""

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Union

from bridge.config.paths import config_dir
from bridge.config.schema import CudaGraphImpl


WARMUP = -1
"""A capture offset: the step after model.cuda_graph_warmup_steps eager steps."""


@dataclass(frozen=True)
class Mechanism:
    """How one engine captures and replays an impl's graphs."""

    what: str
    capture_offset: Optional[int]
    """The capturing step counted from the first step: WARMUP, or 0 for a mechanism that captures
    during the first step itself; None when nothing is captured."""


@dataclass(frozen=True)
class GraphImpl:
    impl: CudaGraphImpl
    captures: str
    """What one graph holds, in words (the plan's and the report's)."""
    unit: Optional[str]
    """"iteration", "layer" or None (eager)."""
    host_syncs_allowed: bool
    """Whether code that reads device values on the host (loss/grad NaN checks, the device sync
    after pipeline send/recv) may run inside the step: not when the whole step is one graph."""
    mechanisms: Dict[str, Mechanism]
    """Engine name -> its mechanism; an engine not listed cannot run this impl."""

    @property
    def graphed(self) -> bool:
        return self.unit is not None

    def capture_step(self, warmup_steps: int, engine: str = "megatron") -> Optional[int]:
        """Index (from the first step) of the step that captures; None when nothing is captured."""
        mechanism = self.mechanisms.get(engine)
        if mechanism is None or mechanism.capture_offset is None:
            return None
        return warmup_steps if mechanism.capture_offset == WARMUP else mechanism.capture_offset

    def describe(self, modules: Sequence[str], warmup_steps: int, engine: str = "megatron") -> str:
        """One line: what is graphed, when, by what."""
        if not self.graphed:
            return "nothing (eager)"
        what = self.captures
        if self.unit == "layer" and modules:
            what = f"{', '.join(modules)} of each layer"
        if engine not in self.mechanisms:
            return f"{what}; the {engine} engine has no mechanism for it"
        step = self.capture_step(warmup_steps, engine)
        when = "during the first step" if step == 0 else f"at step {step}, after {step} eager steps"
        return f"{what}; captured {when} by {self.mechanisms[engine].what}"


EAGER = Mechanism("eager", None)
GRAPH_IMPLS: Dict[CudaGraphImpl, GraphImpl] = {
    graph.impl: graph for graph in (
        GraphImpl(CudaGraphImpl.none, "nothing", None, True, {"megatron": EAGER, "torch": EAGER}),
        GraphImpl(CudaGraphImpl.full_iteration, "forward and backward of the whole iteration", "iteration", False, {
            "megatron": Mechanism("megatron-core FullCudaGraphWrapper", WARMUP),
            "torch": Mechanism("one torch.cuda.graph of forward, backward and the optimizer step", WARMUP)}),
        GraphImpl(CudaGraphImpl.local, "each whole layer", "layer", True, {
            "megatron": Mechanism("megatron-core CudaGraphManager, one per layer", 0),
            "torch": Mechanism("torch.cuda.make_graphed_callables per layer or named module", WARMUP)}),
        GraphImpl(CudaGraphImpl.transformer_engine, "each whole layer", "layer", True, {
            "megatron": Mechanism("Transformer Engine make_graphed_callables (megatron-core TECudaGraphHelper)",
                                  WARMUP)}),
    )
}


def graph_impl(impl: Union[str, CudaGraphImpl]) -> GraphImpl:
    """The vocabulary entry of an impl (its name or the enum member)."""
    return GRAPH_IMPLS[CudaGraphImpl(impl)]


def is_graphed(impl: Union[str, CudaGraphImpl]) -> bool:
    return graph_impl(impl).graphed


COMPILED = "torch_compile:"
"""The torch engine's effective impl under ``torch_compile=MODE`` is ``torch_compile:MODE``: torch.compile, not
this table, decides what it captures (mode reduce-overhead replays CUDA graphs through its cudagraph trees)."""


def compiled_impl(mode: str) -> str:
    return f"{COMPILED}{mode}"


def compile_mode(effective_impl: str) -> Optional[str]:
    """The torch.compile mode of an effective impl, or None for an impl of this table."""
    return effective_impl[len(COMPILED):] if effective_impl.startswith(COMPILED) else None


MEASURED_CHOICE = "auto"
"""The cuda_graph choice that names no impl: it is resolved before training. Its configuration is eager
(conf/cuda_graph/auto.yaml), which is what the catalogue judges and a CPU trains; on a GPU the run times the
graph choices the catalogue accepts against eager and trains with the winner (bridge.auto.candidates,
perf.auto_probe)."""
EAGER_CHOICE = "none"


def graph_choices() -> List[str]:
    """The choices of the cuda_graph group that name a graph configuration: all but eager and the measured one."""
    names = sorted(path.stem for path in (config_dir() / "cuda_graph").glob("*.yaml"))
    return [name for name in names if name not in (EAGER_CHOICE, MEASURED_CHOICE)]


def chosen_graph_choice(choices: Mapping[str, Optional[str]]) -> Optional[str]:
    """The cuda_graph choice of a composition, from Hydra's runtime choices: the command line's (``cuda_graph``)
    over the recipe's own default (``cuda_graph@_global_``), as the composition itself ranks them."""
    return choices.get("cuda_graph") or choices.get("cuda_graph@_global_")
