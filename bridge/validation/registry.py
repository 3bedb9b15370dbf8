"""The rule catalogue: small pure functions of the config, registered by name."""

from typing import Callable, Dict, Iterable, List, Optional, Union

from bridge.validation.violation import Violation

RuleResult = Union[None, Violation, Iterable[Violation]]
RULES: Dict[str, Callable[..., RuleResult]] = {}


def rule(name: str):
    """Register ``fn(cfg)`` under ``name``; it returns None, a Violation or several."""

    def register(fn):
        if name in RULES:
            raise ValueError(f"rule {name!r} registered twice")
        RULES[name] = fn
        fn.rule_name = name
        return fn

    return register


def violation(name: str, keys: List[str], message: str) -> Violation:
    return Violation(name, list(keys), message)


def run_rules(cfg, names: Optional[Iterable[str]] = None) -> List[Violation]:
    found: List[Violation] = []
    for name in names or RULES:
        result = RULES[name](cfg)
        if result is None:
            continue
        found.extend([result] if isinstance(result, Violation) else result)
    return found
