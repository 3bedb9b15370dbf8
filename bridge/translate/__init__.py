"""Translation of a finished GraphBridgeConfig into what megatron-core is given.

versions.py is the table of supported megatron-core releases and how each spells graphbridge's
settings; arguments.py computes the arguments as plain data for any supported release (no
megatron-core import: planning stays light and can target a release that is not installed);
build.py builds the real objects for the installed release.
"""

from bridge.translate.arguments import cuda_graph_arguments, megatron_arguments, padded_vocab_size
from bridge.translate.build import build_megatron_configs, installed_megatron_core
from bridge.translate.versions import RELEASES, SUPPORTED, MegatronCoreRelease, default_release, release

__all__ = ["RELEASES", "SUPPORTED", "MegatronCoreRelease", "build_megatron_configs", "cuda_graph_arguments",
           "default_release", "installed_megatron_core", "megatron_arguments", "padded_vocab_size", "release"]
