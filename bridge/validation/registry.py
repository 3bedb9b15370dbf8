"""The rule catalogue: every rule graphbridge applies, in one registry.

A rule is a small pure function ``check(cfg, target)`` (target: bridge.validation.target.Target)
returning None, a Violation or several. Each is registered with what it rejects and its fix, the
lines of the rule table in docs/rules.md, and with what it judges:

- a config rule (the default) judges the configuration itself: a violation means it can run nowhere;
- an engine rule (``engine="megatron"`` or ``"torch"``) judges what that engine implements. Megatron
  rules apply to configs written for megatron-core (engine=megatron or auto); torch rules apply when
  the torch engine would train, and when engine=auto picked it on this machine their violations
  say the config cannot run *here* (elsewhere megatron-core would train it);
- an environment rule (``environment=True``) judges this machine: GPUs, installed packages and
  their versions. Its violations say the config cannot run here; planning for a cluster still works.

A rule that holds for some megatron-core releases only declares them (``megatron_core=">=0.19"``,
bridge.config.releases.in_range): it applies when the target release is in that range. Where a
release changed a rule, the catalogue holds one rule per range, and the rule table says which.

``mode=plan`` runs every rule, and a run refuses exactly what the plan reports, before a model is
built or a rank is started. Engines define no rules of their own.
"""

from dataclasses import dataclass, replace
from typing import Callable, Dict, Iterable, List, Optional, Union

from bridge.config.releases import in_range
from bridge.validation.violation import CONFIG, HERE, Violation

RuleResult = Union[None, Violation, Iterable[Violation]]
ENGINES = ("megatron", "torch")


@dataclass(frozen=True)
class Rule:
    name: str
    check: Callable[..., RuleResult]
    rejects: str
    fix: str
    engine: Optional[str] = None
    environment: bool = False
    gate: bool = False
    """The other rules read what this one checks: while it fires, they do not run."""
    megatron_core: Optional[str] = None
    """The megatron-core releases the rule holds for (a range such as ``>=0.19``); None: all."""
    before_resolution: bool = False
    """Judges the composed config, ``check(composed)``, before it is resolved: the other rules read the
    finished config, which a config this rule refuses never becomes (judge_composed runs it)."""

    def holds_for(self, megatron_core: str) -> bool:
        return in_range(megatron_core, self.megatron_core)

    def applies(self, target) -> bool:
        if not self.holds_for(target.megatron_core):
            return False
        if self.engine == "megatron":
            return target.written_for_megatron
        if self.engine == "torch":
            return target.engine == "torch"
        return True

    def where(self, target) -> str:
        """Whether a violation of this rule lies in the config or on this machine."""
        if self.environment or (self.engine == "torch" and target.engine_is_auto):
            return HERE
        return CONFIG


RULES: Dict[str, Rule] = {}


def rule(name: str, *, rejects: str, fix: str, engine: Optional[str] = None, environment: bool = False,
         gate: bool = False, megatron_core: Optional[str] = None, before_resolution: bool = False):
    """Register ``fn(cfg, target)`` under ``name``, with the rule table's two cells."""
    if engine not in (None, *ENGINES):
        raise ValueError(f"rule {name!r}: engine must be one of {ENGINES}")

    def register(fn):
        if name in RULES:
            raise ValueError(f"rule {name!r} registered twice")
        in_range("0", megatron_core)  # a malformed range fails at import, not while judging
        RULES[name] = Rule(name, fn, rejects, fix, engine, environment, gate, megatron_core, before_resolution)
        return fn

    return register


def violation(name: str, keys: List[str], message: str) -> Violation:
    return Violation(name, list(keys), message)


def judge_composed(composed) -> List[Violation]:
    """The violations of the rules that judge a composed config before it is resolved."""
    found: List[Violation] = []
    for entry in RULES.values():
        if entry.before_resolution:
            found.extend(replace(v, where=CONFIG) for v in entry.check(composed))
    return found


def run_rules(cfg, target, names: Optional[Iterable[str]] = None) -> List[Violation]:
    """Every violation of a finished config; the gate rules first, and only them when they fire."""
    entries = [entry for entry in (RULES[name] for name in names or RULES) if not entry.before_resolution]
    gates = _violations([entry for entry in entries if entry.gate], cfg, target)
    return gates or _violations([entry for entry in entries if not entry.gate], cfg, target)


def _violations(entries: List[Rule], cfg, target) -> List[Violation]:
    found: List[Violation] = []
    for entry in entries:
        if not entry.applies(target):
            continue
        result = entry.check(cfg, target)
        if result is None:
            continue
        where = entry.where(target)
        found.extend(replace(v, where=where) for v in ([result] if isinstance(result, Violation) else result))
    return found
