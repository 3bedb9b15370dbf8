"""Where the Hydra config tree lives: the checkout's conf/ or the copy inside an installed wheel."""

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent
# A checkout (or editable install) keeps conf/ beside the package; a wheel ships it inside.
_CANDIDATES = (_PACKAGE.parent / "conf", _PACKAGE / "conf")


def config_dir() -> Path:
    for candidate in _CANDIDATES:
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"graphbridge's conf/ not found in {[str(c) for c in _CANDIDATES]}")


def recipes_dir() -> Path:
    return config_dir() / "recipe"
