"""What "the same optimizer step" allows, in numbers: the rounding two Adam implementations stepping the same
gradients may differ by, and the comparison of their fp32 master weights and bf16 model weights against it.
The CPU test of graphbridge's capturable AdamW (tests/test_optimizer_graph.py) and the GPU equivalence job
(tests/gpu/optimizer_equivalence_job.py) both judge by it.

The bound, per element of a master weight p after n steps with learning rates lr_t:

    |p_a - p_b| <= sum over t of  WEIGHT_ULPS * EPS32 * |p|  +  lr_t * (UPDATE_ULPS * EPS32 + NORM_FACTOR * delta_t)

- EPS32 = 2**-23, fp32's machine epsilon. Each step rounds the weight itself: half an epsilon of |p| per
  operation, and torch's AdamW takes two (the decay p * (1 - lr * wd), then the update) where Transformer
  Engine's kernel takes one, so two epsilons of |p| cover both sides.
- The update m_hat / (sqrt(v_hat) + eps) is computed in another order on each side (torch lerps the first
  moment, TE sums beta1 * m + (1 - beta1) * g; the bias corrections and the square root round apart). Each
  moment's rounding decays with its beta, so it stays within about 1 / (1 - beta) = 20 epsilons of its size,
  and |update| stays below 3 for Adam's beta1**2 < beta2: 256 epsilons of the learning rate cover both.
- delta_t is the relative difference of the two gradient norms at step t: the clip factors differ by it, and
  Adam's update, invariant to the scale of its gradients, moves by at most a few times that.
- Nothing feeds back: both step the same gradients, so the differences add up over the steps instead of
  growing with them (what the loss curves of two trainings do, docs/benchmarks.md).

bf16 model weights are the masters rounded to nearest, on both sides (megatron-core copies them in its step,
Float16OptimizerWithFloat16Params._copy_main_params_to_model_params and the distributed optimizer's copy into
the param buffer; the capturable AdamW at the end of its step): each side's are checked to be exactly its
masters rounded, which a copy taken at another time (a step stale, or before the update) breaks. Rounding to
nearest moves a value by at most half a spacing of its binade, and never into a lower binade, so

    |bf16(a) - bf16(b)| <= |a - b| + spacing(max(|bf16(a)|, |bf16(b)|))

and that is the bf16 check: model weights at most one bf16 spacing further apart than their masters. It is
not "one bf16 spacing apart": the bound above lets masters differ by an absolute lr * 256 eps whatever |p|,
and near zero that is many bf16 spacings: a weight that Adam's updates carried to -7.46e-10 on one side and
-7.64e-10 on the other (1.8e-11 apart, a few fp32 ulps of the 1e-4-sized weight it was a step before, under a
thousandth of its bound) is 5 bf16 spacings apart. tests/test_optimizer_graph.py trains a million weights
near zero on the CPU to 8 and 19 spacings after 10 and 100 steps, both sides their masters rounded; the H100
measured 9 (local spec) and 77 (Transformer Engine) after 10 steps of llama/tiny with 659 and 613 of 27.8 M
bf16 weights differing, about what masters an fp32 ulp or two apart predict (27.8 M x 2**-16, an fp32 ulp over
a bf16 spacing, is 424), where a bf16 copy a step stale would leave most of them apart (its last update,
2.7e-4, exceeds the spacing at 0.02, 1.2e-4).
"""

from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

import torch

EPS32 = torch.finfo(torch.float32).eps
WEIGHT_ULPS = 2
UPDATE_ULPS = 256
NORM_FACTOR = 4
BF16_MANTISSA_BITS = 7
CHECKPOINTS = (1, 10, 100)
"""The steps after which the weights are compared (issue #29)."""
SENSITIVITY = 10
"""Most weights must have moved this many times their bound since the start: a step wrong by a tenth of itself
then breaks the bound on most of them, so the comparison can fail."""


@dataclass
class RoundingBudget:
    """The bound's sums over the steps taken so far."""

    steps: int = 0
    lr_sum: float = 0.0
    lr_norm_gap_sum: float = 0.0
    norm_gaps: List[float] = field(default_factory=list)

    def add(self, learning_rate: float, norm_gap: float) -> None:
        self.steps += 1
        self.lr_sum += learning_rate
        self.lr_norm_gap_sum += learning_rate * norm_gap
        self.norm_gaps.append(norm_gap)

    def bound(self, master: torch.Tensor) -> torch.Tensor:
        per_weight = self.steps * WEIGHT_ULPS * EPS32 * master.abs()
        return per_weight + UPDATE_ULPS * EPS32 * self.lr_sum + NORM_FACTOR * self.lr_norm_gap_sum


def norm_gap(reference, candidate) -> float:
    """Relative difference of two gradient norms (floats or one-element tensors); 0 when clipping is off."""
    if reference is None or candidate is None:
        return 0.0
    reference, candidate = float(reference), float(candidate)
    return abs(reference - candidate) / max(abs(reference), 1e-30)


def bf16_spacing(values: torch.Tensor) -> torch.Tensor:
    """The distance from each value to the next bf16 of larger magnitude (8 significant bits)."""
    smallest_normal = torch.finfo(torch.bfloat16).tiny
    magnitude = values.float().abs().clamp_min(smallest_normal)
    return torch.exp2(torch.floor(torch.log2(magnitude)) - BF16_MANTISSA_BITS)


@dataclass
class WeightPair:
    """One parameter on both sides: fp32 masters and bf16 model weights, and the reference master at the start."""

    name: str
    reference_master: torch.Tensor
    reference_model: torch.Tensor
    candidate_master: torch.Tensor
    candidate_model: torch.Tensor
    initial_master: torch.Tensor


def compare(pairs: Sequence[WeightPair], budget: RoundingBudget) -> Dict[str, object]:
    """The measured differences after ``budget.steps`` steps, and how they stand against the bound."""
    worst_ratio, worst_diff, largest_bound, moved = 0.0, 0.0, 0.0, 0
    worst_ulps, worst_excess, differing, elements = 0.0, 0.0, 0, 0
    reference_exact, candidate_exact = True, True
    for pair in pairs:
        reference, candidate = pair.reference_master.float().reshape(-1), pair.candidate_master.float().reshape(-1)
        diff, bound = (reference - candidate).abs(), budget.bound(reference)
        # Where nothing moved yet the bound of a zero weight is zero, and so is its difference.
        worst_ratio = max(worst_ratio, float(torch.where(diff > 0, diff / bound, torch.zeros_like(diff)).max()))
        worst_diff, largest_bound = max(worst_diff, float(diff.max())), max(largest_bound, float(bound.max()))
        moved += int(((reference - pair.initial_master.float().reshape(-1)).abs() > SENSITIVITY * bound).sum())
        reference_model, candidate_model = pair.reference_model.reshape(-1), pair.candidate_model.reshape(-1)
        model_diff = (reference_model.float() - candidate_model.float()).abs()
        spacing = bf16_spacing(torch.maximum(reference_model.float().abs(), candidate_model.float().abs()))
        worst_ulps = max(worst_ulps, float((model_diff / spacing).max()))
        worst_excess = max(worst_excess, float(bf16_excess(reference_model, candidate_model, reference, candidate,
                                                           spacing).max()))
        differing += int((model_diff > 0).sum())
        elements += reference.numel()
        reference_exact &= bool(torch.equal(reference_model, reference.to(reference_model.dtype)))
        candidate_exact &= bool(torch.equal(candidate_model, candidate.to(candidate_model.dtype)))
    return {"steps": budget.steps, "master_bound_ratio": worst_ratio, "max_master_diff": worst_diff,
            "largest_bound": largest_bound, "moved_beyond_sensitivity": moved / elements,
            "bf16_max_spacings": worst_ulps, "bf16_excess_spacings": worst_excess, "bf16_differing": differing,
            "elements": elements, "reference_model_is_its_masters_rounded": reference_exact,
            "candidate_model_is_its_masters_rounded": candidate_exact,
            "max_norm_gap": max(budget.norm_gaps, default=0.0)}


def bf16_excess(reference_model: torch.Tensor, candidate_model: torch.Tensor, reference_master: torch.Tensor,
                candidate_master: torch.Tensor, spacing: torch.Tensor) -> torch.Tensor:
    """How far apart two bf16 weights are beyond their masters' distance, in bf16 spacings of the larger one: at
    most 1 when each is its master rounded to nearest. In float64 the differences of two bf16 or two fp32 values
    are exact unless their magnitudes lie over 2**29 apart, where the excess is half a spacing at most; where it
    reaches 1 (both masters halfway between bf16 neighbours, rounded apart) all is exact: no slack is needed."""
    model_diff = (reference_model.double() - candidate_model.double()).abs()
    master_diff = (reference_master.double() - candidate_master.double()).abs()
    return (model_diff - master_diff) / spacing.double()


def violations(record: Dict[str, object]) -> List[str]:
    """What in one comparison says the two optimizers did not step the same (empty: they did)."""
    found = []
    if record["master_bound_ratio"] > 1:
        found.append(f"fp32 masters {record['max_master_diff']:.3e} apart, {record['master_bound_ratio']:.2f}x the "
                     "rounding bound")
    if record["bf16_excess_spacings"] > 1:
        found.append(f"bf16 weights {record['bf16_excess_spacings']:.2f} bf16 spacings further apart than their fp32 "
                     "masters (at most 1 from rounding)")
    for side in ("reference", "candidate"):
        if not record[f"{side}_model_is_its_masters_rounded"]:
            found.append(f"the {side}'s bf16 weights are not its fp32 masters rounded (copied at another time)")
    moved = record["moved_beyond_sensitivity"]
    if record["steps"] > 1 and moved < 0.5:
        found.append(f"only {moved:.0%} of the weights moved {SENSITIVITY}x their bound: the comparison cannot tell "
                     "a wrong step")
    return found


def paired(reference: Sequence[Tuple[str, torch.Tensor]], candidate: Sequence[Tuple[str, torch.Tensor]]):
    """Parameters of two identically built models, by name, in order."""
    reference, candidate = list(reference), list(candidate)
    names = [name for name, _ in reference]
    assert names == [name for name, _ in candidate], "the two models differ in their parameters"
    return [(name, ref, cand) for (name, ref), (_, cand) in zip(reference, candidate)]
