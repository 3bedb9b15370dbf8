"""`graphbridge --help`: the template is conf/hydra/help/graphbridge.yaml (Hydra's help group);
this module gives it the list of choices through the OmegaConf resolver ``graphbridge.help_groups``.

Hydra's own $APP_CONFIG_GROUPS lists a nested option under its parent group (``recipe/llama:
tiny``) and every workload preset group; a user types ``recipe=llama/tiny`` and never picks a
preset by hand (recipe, gpu and precision pick it), so the list here reads the way options are typed.
"""

import textwrap
from typing import List

from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

RESOLVER = "graphbridge.help_groups"
CHOSEN_FOR_YOU = {"hydra": "see --hydra-help", "preset": "picked by recipe, gpu and precision"}
WIDTH = 100


def options(loader, group: str) -> List[str]:
    """Every option of ``group`` as typed after ``group=``, nested ones as ``sub/option``."""
    found = list(loader.get_group_options(group))
    for sub in loader.list_groups(group):
        found += [f"{sub}/{option}" for option in options(loader, f"{group}/{sub}")]
    return sorted(found)


def help_groups() -> str:
    """One entry per config group, ``group: option, option, ...``, wrapped to the width of the examples."""
    loader = GlobalHydra.instance().config_loader()
    return "\n".join(textwrap.fill(f"{group}: {', '.join(options(loader, group))}", WIDTH, subsequent_indent="  ",
                                   break_on_hyphens=False)
                     for group in sorted(loader.list_groups("")) if group not in CHOSEN_FOR_YOU)


def register_help() -> None:
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, help_groups)
