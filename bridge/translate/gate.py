"""megatron-core's own config classes as the last gate before a launch.

``mode=train`` builds TransformerConfig (or MLATransformerConfig), DistributedDataParallelConfig and
OptimizerConfig from graphbridge's translated arguments (bridge.translate.build) once per job the catalogue
lets through, in the Hydra process, before anything is launched; ``mode=plan`` does so for any config with
``plan.check_megatron=true``, beside the catalogue's violations. Their ``__post_init__`` checks are
megatron-core's verdict: a refusal becomes one violation of the rule ``megatron_core_config``, printed like the
catalogue's (exit 2), never a job that fails after its launch. It is opt-in for plans because importing
megatron-core costs seconds (a plan costs about one).

It judges a config written for the megatron engine, translated for the release installed here; arguments
spelled for another release cannot be built here. Where Transformer Engine is missing, megatron-core's checks
that read TE's version read the target node's instead, and an ImportError means this machine cannot judge
the config, not that megatron-core refuses it.
"""

import importlib
import logging
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import List, Optional

from bridge.config.releases import release
from bridge.config.schema import GraphBridgeConfig, Mode
from bridge.machine import probe
from bridge.translate.build import build_megatron_configs, installed_megatron_core
from bridge.validation import RULES, Target, Violation
from bridge.validation.registry import violation

RULE = "megatron_core_config"
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
SECTIONS = {"DistributedDataParallelConfig": "ddp", "OptimizerConfig": "optimizer"}
"""megatron-core's config class -> the section of ours it is built from; any other (TransformerConfig,
MLATransformerConfig, ModelParallelConfig): model."""


@dataclass(frozen=True)
class MegatronCheck:
    summary: str
    """One line: what megatron-core said, or why it was not asked."""
    violations: List[Violation] = field(default_factory=list)


def check_wanted(cfg: GraphBridgeConfig) -> bool:
    """Every training job is checked (on the megatron engine: not_checkable); a plan when plan.check_megatron asks."""
    return cfg.mode == Mode.train or cfg.plan.check_megatron


def check_megatron_core(cfg: GraphBridgeConfig, target: Target, refused: List[Violation]) -> MegatronCheck:
    """megatron-core's verdict on ``cfg`` judged for ``target``; ``refused``: what the catalogue refuses the job by."""
    with quiet():
        try:
            why_not = not_checkable(cfg, target, refused)
            megatron_utils = None if why_not else importlib.import_module("megatron.core.utils")
        except Exception as error:  # a broken install (TE without its extension fails with FileNotFoundError)
            why_not = f"megatron-core does not import here ({type(error).__name__}: {first_line(error)})"
        if why_not is not None:
            return MegatronCheck(f"not run: {why_not}")
        try:
            with transformer_engine_of(megatron_utils, target):
                build_megatron_configs(cfg)
        except Exception as error:
            return verdict_on(error, target.megatron_core)
    return MegatronCheck(f"megatron-core {target.megatron_core}'s config classes accept it")


def verdict_on(error: Exception, version: str) -> MegatronCheck:
    """A refusal, unless the error is this machine lacking a package (the GPU node has it)."""
    if caused_by_import(error):
        return MegatronCheck(f"cannot judge it here: {type(error).__name__}: {first_line(error)} "
                             "(a package this machine lacks; the GPU node has it)")
    return MegatronCheck(f"megatron-core {version}'s config classes refuse it", [refusal(error, version)])


@contextmanager
def quiet():
    """megatron-core imported and judging in the graphbridge process, which trains nothing and never touches CUDA:
    its warnings and INFO logs on what this process lacks (Transformer Engine, apex) are silenced, and its import's
    torch.cuda.is_available() (0.19.2) asks NVML instead of initialising the CUDA driver here. All as it was
    afterwards, so the training processes started later inherit nothing of it."""
    megatron_log, nvml_check = logging.getLogger("megatron"), os.environ.get(NVML_CHECK)
    level = megatron_log.level
    megatron_log.setLevel(logging.WARNING)
    os.environ[NVML_CHECK] = "1"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        megatron_log.setLevel(level)
        if nvml_check is None:
            del os.environ[NVML_CHECK]
        else:
            os.environ[NVML_CHECK] = nvml_check


def not_checkable(cfg: GraphBridgeConfig, target: Target, refused: List[Violation]) -> Optional[str]:
    """Why megatron-core does not judge the config here, or None."""
    if not target.written_for_megatron:
        return "engine=torch: the config is not written for megatron-core"
    if target.engine != "megatron" and not cfg.plan.check_megatron:
        # The job trains on the torch engine here, which never builds megatron-core's configs: no import to pay.
        return "this machine trains it on the torch engine (plan.check_megatron=true asks all the same)"
    if refused and not cfg.plan.check_megatron:
        # A run asks only before a launch: the catalogue's refusal stays well under a second.
        return "the catalogue refuses the job already"
    gates = sorted({v.rule for v in refused if v.rule in RULES and RULES[v.rule].gate})
    if gates:
        return f"{', '.join(gates)} refuses values megatron-core could not be given"
    installed = probe().version("megatron-core")
    if installed is None:
        return "megatron-core is not installed here"
    if installed == "unknown":  # a source checkout: its version is known once imported
        installed = installed_megatron_core()
    if installed != target.megatron_core:
        return (f"the plan speaks megatron-core {target.megatron_core} and {installed} is installed here "
                "(its config classes judge only their own release's arguments)")
    return None


@contextmanager
def transformer_engine_of(megatron_utils, target: Target):
    """Without Transformer Engine here megatron-core's checks that read its version refuse (0.19.2 reads 0.0.0)
    or crash (0.16.1 compares None): they read the target node's version instead (its tested one when the target
    has none), and what they read before afterwards."""
    if probe().has("transformer-engine"):
        yield
        return
    from packaging.version import Version

    row = release(target.megatron_core)
    node = target.machine.version("transformer-engine")
    if node in (None, "unknown"):
        node = row.tested_transformer_engine[-1] if row.tested_transformer_engine else row.transformer_engine[0]
    saved = megatron_utils._te_version
    megatron_utils._te_version = Version(node)
    try:
        yield
    finally:
        megatron_utils._te_version = saved


def caused_by_import(error: BaseException) -> bool:
    """Whether ``error`` is, or was raised while handling, an ImportError (megatron-core reaching for TE)."""
    while error is not None:
        if isinstance(error, ImportError):
            return True
        error = error.__cause__ or error.__context__
    return False


def refusal(error: BaseException, version: str) -> Violation:
    """One line: the class that refused, megatron-core's words, and which of our keys to change."""
    refused_by = refusing_class(error)
    section = SECTIONS.get(refused_by, "model")
    words = first_line(error).rstrip(".") or f"(no message) at {where_raised(error)}"
    return violation(RULE, [f"{section}.*"], (
        f"megatron-core {version} ({refused_by or 'its config classes'}) refuses it: {type(error).__name__}: {words}; "
        f"change the {section}.* keys it names (its field names are graphbridge's; `graphbridge mode=plan "
        "plan.format=json` shows every argument it is given, under megatron)"))


def refusing_class(error: BaseException) -> Optional[str]:
    """The config class whose ``__post_init__`` raised ``error`` (the innermost one), or None."""
    name, frame = None, error.__traceback__
    while frame is not None:
        if frame.tb_frame.f_code.co_name == "__post_init__" and "self" in frame.tb_frame.f_locals:
            name = type(frame.tb_frame.f_locals["self"]).__name__
        frame = frame.tb_next
    return name


def where_raised(error: BaseException) -> str:
    frame = error.__traceback__
    while frame.tb_next is not None:
        frame = frame.tb_next
    return f"{frame.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.tb_lineno}"


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""
