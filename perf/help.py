"""`graphbridge --help`: the template is conf/hydra/help/graphbridge.yaml (Hydra's help group);
this module gives it the list of choices through the OmegaConf resolver ``graphbridge.help_groups``.

Hydra's own $APP_CONFIG_GROUPS lists a nested option under its parent group (``recipe/llama:
tiny``) and every workload preset group; a user types ``recipe=llama/tiny`` and never picks a
preset by hand (recipe, gpu and precision pick it), so the list here reads the way options are typed.
"""

import textwrap
from typing import List, Sequence

from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

RESOLVER = "graphbridge.help_groups"
CHOSEN_FOR_YOU = {"hydra": "see --hydra-help", "preset": "picked by recipe, gpu and precision"}
WIDTH = 100
NESTING = 3
"""How deep options nest below a group (recipe=family/name is 1): a symlink loop in a --config-dir
nests without end."""
PRINTS_HELP = ("--help", "-h", "--resolve", "--info", "-i")
"""The flags that print the help template or resolve Hydra's config, which holds it."""


def options(loader, group: str, depth: int = 0) -> List[str]:
    """Every option of ``group`` as typed after ``group=``, nested ones as ``sub/option``."""
    found = list(loader.get_group_options(group))
    for sub in loader.list_groups(group) if depth < NESTING else []:
        found += [f"{sub}/{option}" for option in options(loader, f"{group}/{sub}", depth + 1)]
    return sorted(found)


def help_groups() -> str:
    """One entry per config group, ``group: option, option, ...``, wrapped to the width of the examples."""
    loader = GlobalHydra.instance().config_loader()
    return "\n".join(textwrap.fill(f"{group}: {', '.join(options(loader, group))}", WIDTH, subsequent_indent="  ",
                                   break_on_hyphens=False)
                     for group in sorted(loader.list_groups("")) if group not in CHOSEN_FOR_YOU)


def register_help(argv: Sequence[str]) -> None:
    """Register the resolver for a command line that prints the help. Only then: OmegaConf resolves
    the template whenever Hydra merges its config (twice a run, 0.3 s each), and a plan or a run
    never shows it."""
    if any(arg.split("=", 1)[0] in PRINTS_HELP for arg in argv) and not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, help_groups)
