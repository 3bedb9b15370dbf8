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

bf16 model weights are the masters rounded to nearest: masters within the bound and well under a bf16 spacing
apart round to the same value or to neighbours, so two model weights may differ by one bf16 spacing at most.
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
    worst_ulps, differing, elements, copies_exact = 0.0, 0, 0, True
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
        differing += int((model_diff > 0).sum())
        elements += reference.numel()
        copies_exact &= bool(torch.equal(candidate_model, candidate.to(candidate_model.dtype)))
    return {"steps": budget.steps, "master_bound_ratio": worst_ratio, "max_master_diff": worst_diff,
            "largest_bound": largest_bound, "moved_beyond_sensitivity": moved / elements,
            "bf16_max_spacings": worst_ulps, "bf16_differing": differing, "elements": elements,
            "candidate_model_is_its_masters_rounded": copies_exact,
            "max_norm_gap": max(budget.norm_gaps, default=0.0)}


def violations(record: Dict[str, object]) -> List[str]:
    """What in one comparison says the two optimizers did not step the same (empty: they did)."""
    found = []
    if record["master_bound_ratio"] > 1:
        found.append(f"fp32 masters {record['max_master_diff']:.3e} apart, {record['master_bound_ratio']:.2f}x the "
                     "rounding bound")
    if record["bf16_max_spacings"] > 1:
        found.append(f"bf16 weights {record['bf16_max_spacings']:.2f} bf16 spacings apart (at most 1 from rounding)")
    if not record["candidate_model_is_its_masters_rounded"]:
        found.append("the candidate's bf16 weights are not its fp32 masters rounded")
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
