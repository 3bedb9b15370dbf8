"""Record what one megatron-core release is and accepts, from the real package, for machines that
cannot install it (megatron-core >= 0.17 needs Python >= 3.12; CI runs 3.11).

    python scripts/megatron_fixture.py            # the megatron-core this Python imports
    PYTHONPATH=<its site> python scripts/megatron_fixture.py
    python scripts/megatron_fixture.py --check    # exit 1 when tests/fixtures/ differs

It writes tests/fixtures/megatron_core_<version>.json: the fields of TransformerConfig,
MLATransformerConfig, DistributedDataParallelConfig, OptimizerConfig and GPTModel; the CUDA-graph
vocabulary (impls, module names, inference scopes per impl, deprecated values); and, for every
configuration in tests/rule_cases.py, a digest of what graphbridge translates it to for this
release and whether the release's own config classes accept it (their ``__post_init__`` runs).
tests/test_versions.py checks graphbridge's version table, translation and rule verdicts against
it. It needs no GPU: it runs wherever the release imports (on a CPU machine too).
"""

import dataclasses
import hashlib
import importlib.util
import inspect
import json
import os
import re
import sys
import typing
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT))  # tests.rule_cases, and bridge in a checkout that is not installed


def fixture_path(version: str) -> Path:
    return FIXTURES / f"megatron_core_{version}.json"


def arguments_digest(cfg, version: str) -> str:
    """What graphbridge gives ``version`` for ``cfg``, hashed: a verdict recorded for other
    arguments no longer applies."""
    from bridge.translate import megatron_arguments

    text = json.dumps(megatron_arguments(cfg, version), sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def case_ids():
    """(id, case) for every configuration of tests/rule_cases.py, in a stable order."""
    from tests.extra_rejects import EXTRA_REJECTS
    from tests.rule_cases import RULE_CASES

    for rule, (reject, accept) in sorted(RULE_CASES.items()):
        yield f"{rule}/reject", reject
        yield f"{rule}/accept", accept
    for rule, cases in sorted(EXTRA_REJECTS.items()):
        for index, case in enumerate(cases):
            yield f"{rule}/extra{index}", case


def judge_with_transformer_engine_of(machine) -> None:
    """Some checks of megatron-core read Transformer Engine's version. Where TE is not installed (a
    CPU machine), they read the version of the case's machine, so the verdict does not depend on
    where the fixture was recorded."""
    import megatron.core.utils as megatron_utils
    from packaging.version import Version

    if importlib.util.find_spec("transformer_engine") is None:
        wanted = machine.packages.get("transformer-engine")
        megatron_utils._te_version = Version(wanted) if wanted else None


def sorted_sets(message: str) -> str:
    """A message that prints a set of strings, with the set sorted: set order changes between runs."""
    def sort(match):
        return "{" + ", ".join(sorted(match.group(1).split(", "))) + "}"
    return re.sub(r"\{('[^{}]*')\}", sort, message)


def without_install_path(message: str) -> str:
    """A message with the folder megatron-core is installed in left out: it differs between machines."""
    import megatron

    install_folder = str(Path(next(iter(megatron.__path__))).parent) + os.sep
    return message.replace(install_folder, "")


def verdict(cfg, machine) -> dict:
    """Whether the installed release's config classes accept ``cfg``, translated for it."""
    from bridge.translate import build_megatron_configs

    judge_with_transformer_engine_of(machine)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            build_megatron_configs(cfg)
        except Exception as error:  # every refusal is recorded, whatever megatron-core raises
            first_line = sorted_sets(without_install_path((str(error).strip().splitlines() or [""])[0]))[:200]
            return {"accepts": False, "error": f"{type(error).__name__}: {first_line}"}
    return {"accepts": True}


def field_names(cls) -> list:
    return sorted(field.name for field in dataclasses.fields(cls))


def graph_vocabulary() -> dict:
    from megatron.core.transformer import enums
    from megatron.core.transformer.transformer_config import TransformerConfig

    impl_type = typing.get_type_hints(TransformerConfig)["cuda_graph_impl"]
    modules = getattr(enums, "CudaGraphModule", None) or enums.CudaGraphScope
    vocabulary = {"impls": list(typing.get_args(impl_type)), "modules": [member.name for member in modules],
                  "inference_scopes": {}, "deprecated_values": []}
    try:
        from megatron.core.transformer import cuda_graph_config
    except ImportError:  # before 0.19: no inference scope, no migration module
        return vocabulary
    vocabulary["inference_scopes"] = {
        impl: sorted(scope.name for scope in scopes) for impl, scopes in cuda_graph_config.ALLOWED_INFERENCE_SCOPES.items()}
    vocabulary["inference_scope_defaults"] = {
        impl: cuda_graph_config.normalize_inference_cuda_graph_scope(None, impl).name for impl in vocabulary["impls"]}
    vocabulary["deprecated_values"] = sorted(cuda_graph_config.CUDA_GRAPH_MODULES_DEPRECATIONS)
    return vocabulary


def fixture() -> dict:
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    from bridge.translate import installed_megatron_core
    from tests.rule_cases import build

    version = installed_megatron_core()
    verdicts = {}
    for case_id, case in case_ids():
        cfg = build(case)
        try:
            digest = arguments_digest(cfg, version)
        except Exception as error:  # a config translation cannot read (the catalogue refuses it)
            verdicts[case_id] = {"translates": False, "error": type(error).__name__}
            continue
        verdicts[case_id] = {"digest": digest, **verdict(cfg, case.machine)}
    return {
        "megatron_core": version,
        "generated_by": "python scripts/megatron_fixture.py",
        "fields": {
            "TransformerConfig": field_names(TransformerConfig),
            "MLATransformerConfig": field_names(MLATransformerConfig),
            "DistributedDataParallelConfig": field_names(DistributedDataParallelConfig),
            "OptimizerConfig": field_names(OptimizerConfig),
            "GPTModel": [name for name in inspect.signature(GPTModel.__init__).parameters if name != "self"],
        },
        "cuda_graph": graph_vocabulary(),
        "verdicts": verdicts,
    }


def main() -> int:
    recorded = fixture()
    path = fixture_path(recorded["megatron_core"])
    text = json.dumps(recorded, indent=1, sort_keys=True) + "\n"
    if "--check" in sys.argv[1:]:
        if not path.exists() or path.read_text() != text:
            print(f"{path.relative_to(ROOT)} is out of date for megatron-core {recorded['megatron_core']}: "
                  "run python scripts/megatron_fixture.py with that release importable", file=sys.stderr)
            return 1
        return 0
    FIXTURES.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path.relative_to(ROOT)}: {len(recorded['verdicts'])} configurations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
