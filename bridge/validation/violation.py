"""One broken rule: which rule, which keys, and a message that names the fixing override."""

from dataclasses import asdict, dataclass
from typing import List

CONFIG, HERE = "config", "here"
"""Where a violation lies: in the configuration (it can run nowhere), or on this machine (it can
run elsewhere: another machine's GPUs or packages)."""


@dataclass(frozen=True)
class Violation:
    rule: str
    keys: List[str]
    message: str
    where: str = CONFIG

    @property
    def in_config(self) -> bool:
        return self.where == CONFIG

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"[{self.rule}] {', '.join(self.keys)}: {self.message}"
