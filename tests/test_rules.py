"""Every rule of the catalogue has a reject test and an accept test, a message that names the fix,
and a row in docs/rules.md."""

import shutil

import pytest
import rule_table
from sections import with_section

import bridge
from bridge.config.load import compose_config
from bridge.validation import RULES, judge_composed, resolve_target, validate
from tests.gpu_witnesses import GPU_WITNESSES, read_record, record_machine
from tests.extra_rejects import EXTRA_REJECTS
from tests.rule_cases import LAPTOP, ONE_H100, RULE_CASES, build, fired
from tests.sampling import every


JUDGED_COMPOSED = {name for name, entry in RULES.items() if entry.before_resolution}
"""Rules that read a composed config, which rule_cases' finished configs cannot carry: tested below."""


def test_every_rule_has_cases():
    assert set(RULE_CASES) == set(RULES) - JUDGED_COMPOSED


def test_resolvable_rejects_an_interpolation_to_nothing():
    [refused] = judge_composed(compose_config(["recipe=llama/tiny", "train.train_iters=${oops}"]))
    assert refused.rule == "resolvable" and refused.keys == ["train.train_iters"] and refused.in_config
    assert "Interpolation key 'oops' not found; give it a value of its type" in refused.message


def test_resolvable_accepts_an_interpolation_to_a_value_of_its_type():
    assert judge_composed(compose_config(["recipe=llama/tiny", "train.train_iters=${train.micro_batch_size}"])) == []


def test_the_catalogue_of_finished_configs_leaves_the_composed_rules_out():
    assert not any(violation.rule in JUDGED_COMPOSED for violation in bridge.validate(bridge.load(["recipe=llama/tiny"])))


FIXES = ("set ", "use ", "add ", "drop ", "raise ", "remove ", "change", "keep ", "pip install", "lower ", "run it ",
         "start ")


@pytest.mark.parametrize("rule", sorted(RULE_CASES))
def test_rule_rejects(rule):
    """The rule refuses its reject case, and its message names the keys and the fix (judged once for both)."""
    reject, _ = RULE_CASES[rule]
    cfg = build(reject)
    violations = validate(cfg, resolve_target(cfg, reject.machine, reject.processes, reject.graphs_measured))
    assert rule in {violation.rule for violation in violations}
    for violation in violations:
        if violation.rule == rule:
            assert violation.keys and all("." in key or key in ("engine", "device", "torch_compile", "cuda_graph")
                                          for key in violation.keys)
            assert any(word in violation.message for word in FIXES)


@pytest.mark.parametrize("rule", sorted(RULE_CASES))
def test_rule_accepts(rule):
    _, accept = RULE_CASES[rule]
    assert rule not in fired(accept)


@pytest.mark.parametrize(
    "rule,case", [(rule, case) for rule, cases in sorted(EXTRA_REJECTS.items()) for case in cases]
)
def test_rule_rejects_other_forms(rule, case):
    assert rule in fired(case)


def test_the_megatron_engine_is_offered_only_where_it_can_train():
    cfg = build(RULE_CASES["torch_engine_parallelism"][0])  # engine=torch, chosen by the user

    def fix_on(machine) -> str:
        [message] = [v.message for v in validate(cfg, resolve_target(cfg, machine)) if v.rule == "torch_engine_parallelism"]
        return message

    assert fix_on(ONE_H100).endswith("or use engine=megatron")
    assert "engine=megatron" not in fix_on(LAPTOP) and "run it where a CUDA GPU and megatron-core are" in fix_on(LAPTOP)


def test_all_violations_reported_at_once():
    reject = RULE_CASES["cpu_offloading"][0]
    case = type(reject)({**reject.changes, "model.cuda_graph_modules": ["attn", "bogus"], "train.train_iters": 0})
    assert {"cpu_offloading", "module_names", "positive_sizes"} <= fired(case)


def test_every_rule_is_documented_for_the_readme():
    for entry in RULES.values():
        assert entry.rejects.strip() and entry.fix.strip(), entry.name


def test_the_rule_table_lists_every_rule_and_is_up_to_date():
    page = rule_table.RULES_PAGE.read_text()
    assert with_section(page, "rules", rule_table.markdown()) == page, (
        "docs/rules.md's rule table is out of date: run python scripts/rule_table.py")
    assert all(f"| `{name}` |" in page for name in RULES)


# --- verdicts through the command line: every command line below planned by one `graphbridge` process a session --

WRONG_TYPES = ["model.cuda_graph_modules=[[attn]]", "model.recompute_modules=[[core_attn]]"]


def wrong_type_plan(override: str) -> tuple:
    return "mode=plan", "cuda_graph=te_attn", override


@pytest.mark.parametrize("override", WRONG_TYPES)
def test_a_value_of_the_wrong_type_holds_back_the_rules_that_would_read_it(planned, override):
    result = planned[wrong_type_plan(override)]
    assert result.returncode == 2 and "Traceback" not in result.stderr
    violations = [line for line in result.stderr.splitlines() if line.startswith("  [")]
    assert len(violations) == 1 and violations[0].startswith("  [config_types]"), result.stderr


# Every other witness by default (a plan each, the same path); the rest under -m slow.
@pytest.mark.parametrize("rule", every(sorted(GPU_WITNESSES), 2))
def test_a_gpu_witness_is_refused_by_its_rule(rule):
    """The recorded run failed with the recorded error, and its overrides are what the rule refuses now on the
    machine it ran on (one H100 with the record's megatron-core and Transformer Engine)."""
    witness = GPU_WITNESSES[rule]
    record = read_record(witness.record)
    run = next(run for run in record["runs"] if run["index"] == witness.run)
    assert run["status"] in ("failed", "timeout") and witness.error in run["error"]  # a timeout: a hang
    machine = record_machine(record["summary"])
    assert rule in {violation.rule for violation in bridge.plan(run["overrides"], machine=machine).violations}


@pytest.mark.skipif(shutil.which("c++") is None, reason="torch.compile on the CPU needs a C++ compiler")
@pytest.mark.parametrize("dropout,refused", [(0.1, True), (0.0, False)])
def test_the_compiled_bias_dropout_add_refuses_a_retained_backward_only_with_dropout(dropout, refused):
    """retained_backward_compiled_fusion's premise, on the CPU through megatron-core's own fused function: with
    dropout its compiled backward keeps the mask as a donated buffer, and once a step has compiled that backward,
    a backward that retains the graph (as capture's does) is refused; without dropout nothing is kept."""
    import torch
    from megatron.core.fusions.fused_bias_dropout import bias_dropout_add_fused_train

    def step(**backward):
        hidden, residual = torch.randn(8, 16, requires_grad=True), torch.randn(8, 16, requires_grad=True)
        bias_dropout_add_fused_train((hidden, None), residual, dropout).sum().backward(**backward)

    # Cached compilations skip the donated-buffer bookkeeping: torch 2.11 hid the refusal behind its caches. No
    # precompiled header either: inductor writes it (155 MB) to the system's temporary folder whatever its cache dir.
    with torch._inductor.config.patch(fx_graph_cache=False, cpp_cache_precompile_headers=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        torch._dynamo.reset()
        step()  # the eager steps before capture compile the backward
        if refused:
            with pytest.raises(RuntimeError, match="donated buffers"):
                step(retain_graph=True)
        else:
            step(retain_graph=True)
        torch._dynamo.reset()


QWEN_FP8_FP64 = ["recipe=qwen/tiny", "precision=fp8_cs", "model.moe_token_dispatcher_type=alltoall",
                 "model.moe_grouped_gemm=true", "model.moe_router_dtype=fp64", "gpu=h100"]


SEEN_AT_4EBF167 = [
    (["recipe=deepseek/tiny", "cuda_graph=te_mlp", "train.num_gpus=2", "model.pipeline_model_parallel_size=2",
      "gpu=h100"], None),
    (["recipe=llama/tiny", "cuda_graph=te_layer", "train.num_gpus=3", "model.pipeline_model_parallel_size=3",
      "model.pipeline_model_parallel_layout='E|t*4|t*4L'", "train.global_batch_size=4", "gpu=h100"],
     None),  # a stage of the embedding alone: no layer at all there
    (QWEN_FP8_FP64, "quantized_experts_fp64_probs"),
    *(([*QWEN_FP8_FP64, f"plan.megatron_core={release}", "model.moe_router_padding_for_fp8=true"], None)
      for release in ("0.16.1", "0.19.2")),
]


@pytest.mark.parametrize("overrides,refused_by", SEEN_AT_4EBF167)
def test_what_the_two_gpu_differential_saw_fail_at_4ebf167_is_refused_with_its_fix_or_trains(planned, overrides,
                                                                                           refused_by):
    """deepseek/tiny's MoE stage under te_mlp hung while the engine refused a pipeline rank with no layer to graph; such
    a rank (or a stage without layers) now meets the others' capture, so both plan valid. fp64 probs into fp8 grouped
    experts failed; a router that pads for fp8 leaves the experts nothing to pad (0.19 skips their padding, and
    0.16.1's finds every expert aligned: it trained on an H200 at ec177b3), so that configuration plans valid."""
    result = planned[("mode=plan", *overrides)]
    if refused_by is None:
        assert result.returncode == 0, result.stderr[-2000:]
        return
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = next(line for line in result.stderr.splitlines() if line.startswith(f"  [{refused_by}]"))
    assert "set model.moe_router_dtype=fp32" in line


GPT_OSS_FP8_FP64_DROP_AND_PAD = ["recipe=gpt_oss/tiny", "precision=fp8_sc", "model.moe_token_dispatcher_type=alltoall",
                                 "model.moe_pad_expert_input_to_capacity=true", "model.moe_router_dtype=fp64",
                                 "gpu=h100"]


FP64_RELEASES = ["0.16.1", "0.19.2"]
FP64_FACTORS = [("1.0", False), ("1.1", True)]


def fp64_plan(release: str, factor: str) -> tuple:
    return ("mode=plan", *GPT_OSS_FP8_FP64_DROP_AND_PAD, f"model.moe_expert_capacity_factor={factor}",
            f"plan.megatron_core={release}")


@pytest.mark.parametrize("release", FP64_RELEASES)
@pytest.mark.parametrize("factor,refused", FP64_FACTORS)
def test_fp64_probs_into_fp8_experts_plan_valid_where_drop_and_pad_leaves_no_rows_to_pad(planned, release, factor,
                                                                                         refused):
    """gpt_oss/tiny's router sees 512 tokens and sends each of 8 experts its top-2 share: capacity 128 at factor 1.0,
    a multiple of fp8's 16 rows, which trained on the GPU with the rule bypassed; 141 at factor 1.1 is not, and the
    refusal names the alignment."""
    result = planned[fp64_plan(release, factor)]
    if not refused:
        assert result.returncode == 0, result.stderr[-2000:]
        return
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = next(line for line in result.stderr.splitlines() if line.startswith("  [quantized_experts_fp64_probs]"))
    assert "expert capacity is a multiple of 16 (it is 141 here)" in line


TP_HEADS = [
    (["model.num_attention_heads=8", "model.num_query_groups=4", "model.tensor_model_parallel_size=16",
      "train.num_gpus=16"], "model.tensor_model_parallel_size=8"),
    (["model.hidden_size=384", "model.num_attention_heads=12", "model.num_query_groups=6",
      "model.tensor_model_parallel_size=4", "train.num_gpus=4"], "model.tensor_model_parallel_size=2"),
    (["model.num_attention_heads=8", "model.num_query_groups=2", "model.tensor_model_parallel_size=4",
      "train.num_gpus=4"], None),  # two groups divide TP4: each group's keys and values serve two ranks
]


def tp_heads_plan(overrides) -> tuple:
    return ("mode=plan", "recipe=llama/tiny", "gpu=h100", *overrides)


@pytest.mark.parametrize("overrides,fix", TP_HEADS)
def test_tensor_parallelism_that_cannot_split_the_heads_is_refused_with_the_size_that_can(planned, overrides, fix):
    """megatron-core's TransformerConfig refuses heads that TP does not divide, and query groups that are neither a
    multiple nor a divisor of TP; the layouts of 16 ranks planned the first valid before this rule."""
    result = planned[tp_heads_plan(overrides)]
    refusal = [line for line in result.stderr.splitlines() if line.startswith("  [tensor_parallel_heads]")]
    if fix is None:
        assert not refusal, result.stderr[-2000:]
        return
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert fix in refusal[0]


NEXT_TP32 = ["model.tensor_model_parallel_size=32", "train.num_gpus=256", "model.num_attention_heads=32",
             "model.sequence_parallel=true"]


NEXT_LAYOUTS = [
    ("0.16.1", ["model.context_parallel_size=2"], "gated_delta_net_context_parallel"),
    ("0.19.2", ["model.context_parallel_size=2"], None),  # 0.19 splits the linear heads over CP too
    ("0.16.1", NEXT_TP32, "tensor_parallel_heads"),
    ("0.19.2", ["model.tensor_model_parallel_size=8", "model.context_parallel_size=4", "train.num_gpus=256",
                "model.sequence_parallel=true"], "tensor_parallel_heads"),
]


def next_plan(release: str, overrides) -> tuple:
    return ("mode=plan", "recipe=qwen/qwen3_next_80b_a3b", "gpu=h100", f"plan.megatron_core={release}", *overrides)


@pytest.mark.parametrize("release,overrides,refused_by", NEXT_LAYOUTS)
def test_qwen3_next_gated_delta_net_layouts_megatron_core_refuses_are_refused(planned, release, overrides,
                                                                            refused_by):
    """Qwen3-Next's 16 linear key heads: 0.16.1 splits them over TP and takes no CP, 0.19 splits them over TP x CP;
    TransformerConfig refuses an uneven split (the plans were valid before these rules)."""
    result = planned[next_plan(release, overrides)]
    if refused_by is None:
        assert result.returncode == 0, result.stderr[-2000:]
        return
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert any(line.startswith(f"  [{refused_by}]") for line in result.stderr.splitlines()), result.stderr[-2000:]


DEEPSEEK_LAYOUTS = [
    (None, None),  # the H100 preset's own: 61 layers and the MTP layer over PP8 x VP4
    ("Et|(tt|)*29mL", "31 stages do not divide over PP=8"),
    ("Et|(tt|)*30L", "it places 0 MTP layers, and model.mtp_num_layers=1"),
    ("Et|(tt|)*30Lm", "the loss L once, last"),
]


def deepseek_plan(layout) -> tuple:
    override = [f'model.pipeline_model_parallel_layout="{layout}"'] if layout else []
    return ("mode=plan", "recipe=deepseek/deepseek_v3", "gpu=h100", *override)


@pytest.mark.parametrize("layout, refused", DEEPSEEK_LAYOUTS)
def test_deepseek_v3s_pipeline_layout_is_checked_as_megatron_core_checks_it(planned, layout, refused):
    """TransformerConfig parses the layout at model build; a miscounted one planned VALID before pipeline_layout."""
    result = planned[deepseek_plan(layout)]
    refusal = [line for line in result.stderr.splitlines() if line.startswith("  [pipeline_layout]")]
    if refused is None:
        assert result.returncode == 0 and not refusal, result.stderr[-2000:]
        return
    assert result.returncode == 2 and "Traceback" not in result.stderr and refused in refusal[0], result.stderr


CLI_PLANS = [*(wrong_type_plan(override) for override in WRONG_TYPES),
             *(("mode=plan", *overrides) for overrides, _ in SEEN_AT_4EBF167),
             *(fp64_plan(release, factor) for release in FP64_RELEASES for factor, _ in FP64_FACTORS),
             *(tp_heads_plan(overrides) for overrides, _ in TP_HEADS),
             *(next_plan(release, overrides) for release, overrides, _ in NEXT_LAYOUTS),
             *(deepseek_plan(layout) for layout, _ in DEEPSEEK_LAYOUTS)]


@pytest.fixture(scope="session")
def planned(cli_batch) -> dict:
    """Each command line of CLI_PLANS -> its `graphbridge` result: all of them planned by one process a session
    (conftest.py's cli_batch), each with its own output and exit status."""
    return cli_batch("rule_plans", CLI_PLANS)
