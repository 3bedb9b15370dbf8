"""Checks on the argument list itself, before anything reads it: flags Hydra's argparse would answer
with a usage block (an unknown one, one between overrides), bytes that are not UTF-8, a key too
long to be a file name (Hydra looks keys up as config groups), a Slurm submission from a machine
without Slurm, and a symlink loop in a --config-dir that --help would walk without end. Each is one
line naming the argument."""

import os
import shutil
from pathlib import Path
from typing import List, Optional

# Hydra's own flags and the ones that take a value.
FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--info", "--config-path", "-cp", "--config-name", "-cn",
                    "--config-dir", "-cd", "--experimental-rerun", "--shell-completion", "-sc"}
FLAGS = FLAGS_WITH_VALUE | {"--help", "-h", "--hydra-help", "--version", "--resolve", "--run", "-r", "--multirun",
                            "-m", "-i"}
CHOICES = {"--cfg": ("job", "hydra", "all"), "--info": ("all", "config", "defaults", "defaults-tree", "plugins",
                                                         "searchpath")}
CHOICES.update({"-c": CHOICES["--cfg"], "-i": CHOICES["--info"]})
NAME_MAX = 255  # the longest file name Linux allows


def shown(arg: str, width: int = 80) -> str:
    """An argument as it can be printed: undecodable bytes as \\xNN, a long one shortened."""
    text = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text if len(text) <= width else f"{text[:width - 20]}...{text[-15:]} ({len(text)} characters)"


def encoding_error(argv: List[str]) -> Optional[str]:
    """Python hands bytes that are not UTF-8 over as surrogates, which Hydra's parser cannot read."""
    for arg in argv:
        byte = next((ord(char) - 0xDC00 for char in arg if 0xDC80 <= ord(char) <= 0xDCFF), None)
        if byte is not None:
            return (f"{shown(arg)}: byte 0x{byte:02x} is not UTF-8 text; type the argument in UTF-8 (check the "
                    "encoding of the terminal or script)")
    return None


def flag_error(argv: List[str]) -> Optional[str]:
    """Hydra's argparse names an unknown flag, a value outside a flag's choices, or overrides on both
    sides of a flag, in a usage block."""
    flag_after_overrides, overrides_seen, index = None, False, 0
    while index < len(argv):
        arg, index = argv[index], index + 1
        flag, _, value = arg.partition("=")
        if not arg.startswith("-"):
            if flag_after_overrides:
                return (f"{flag_after_overrides}: Hydra takes its flags before the overrides; write graphbridge "
                        f"{flag_after_overrides} <overrides> (e.g. graphbridge -m mode=plan cuda_graph=none,te_attn)")
            overrides_seen = True
            continue
        if flag not in FLAGS:
            return f"{shown(arg)}: no such flag (graphbridge --help lists them; a setting is written key=value)"
        flag_after_overrides = flag_after_overrides or (arg if overrides_seen else None)
        # argparse takes the next argument as the value, unless it is a flag (--info's value is optional)
        if arg in FLAGS_WITH_VALUE and index < len(argv) and not argv[index].startswith("-"):
            value, index = argv[index], index + 1
        if value and flag in CHOICES and value not in CHOICES[flag]:
            return f"{flag} {shown(value)}: not one of {', '.join(CHOICES[flag])}"
    return None


def long_key_error(overrides: List[str]) -> Optional[str]:
    """Hydra looks every key up as a config group, a file name; a longer name fails with a traceback."""
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if any(len(part.encode("utf-8")) > NAME_MAX for part in key.split("/")):
            return f"{shown(override)}: no config key or group has a name this long (at most {NAME_MAX} bytes)"
    return None


def submission_error(argv: List[str]) -> Optional[str]:
    """The submitit Slurm launcher fails in a traceback where there is no ``srun``. Only a sweep starts
    the launcher: a single run, and so a plan, of the same command needs no Slurm."""
    overrides = [arg for arg in argv if not arg.startswith("-")]
    launchers = [override.split("=", 1)[1] for override in overrides
                 if override.split("=", 1)[0].lstrip("+") == "hydra/launcher" and "=" in override]
    submits = any(arg in ("-m", "--multirun") for arg in argv) or "hydra.mode=MULTIRUN" in overrides
    if not (submits and launchers and launchers[-1] == "submitit_slurm") or shutil.which("srun"):
        return None
    return ("hydra/launcher=submitit_slurm submits to Slurm, and this machine has no srun: run the command on a "
            "Slurm login node, or plan it here, which needs no Slurm: mode=plan without -m (graphbridge-workload: -d)")


def loop_error(roots: List[Path]) -> Optional[str]:
    """A symlink in a --config-dir to a directory above it: Hydra's --help lists the config groups by
    walking every directory, and would follow that loop until the path is too long."""
    for root in roots:
        seen = set()
        for directory, subdirs, _ in os.walk(root, followlinks=True):
            real = os.path.realpath(directory)
            for name in subdirs:
                target = os.path.realpath(Path(directory) / name)
                if (Path(directory) / name).is_symlink() and (real + os.sep).startswith(target + os.sep):
                    return (f"{Path(directory) / name}: a symlink to {target}, which holds it: a loop that --help "
                            "would list without end; remove the link")
            seen.add(real)
            subdirs[:] = [name for name in subdirs if os.path.realpath(Path(directory) / name) not in seen]
    return None
