"""Translation of a finished GraphBridgeConfig into what megatron-core is given.

The table of supported megatron-core releases and how each spells graphbridge's settings is on the
ground floor (bridge/config/releases.py); arguments.py computes the arguments as plain data for any supported release (no
megatron-core import: planning stays light and can target a release that is not installed);
build.py builds the real objects for the installed release; gate.py has them judge a job before its launch
(and a plan that asks), a refusal one more violation.
"""

from bridge.translate.arguments import cuda_graph_arguments, megatron_arguments
from bridge.translate.build import build_megatron_configs, installed_megatron_core

__all__ = ["build_megatron_configs", "cuda_graph_arguments", "installed_megatron_core", "megatron_arguments"]
