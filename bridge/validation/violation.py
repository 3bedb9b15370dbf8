"""One broken rule: which rule, which keys, and a message that names the fixing override."""

from dataclasses import asdict, dataclass
from typing import List


@dataclass(frozen=True)
class Violation:
    rule: str
    keys: List[str]
    message: str

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"[{self.rule}] {', '.join(self.keys)}: {self.message}"
