"""What each engine implements, as data: the catalogue's engine rules judge a config against it,
and the torch engine's native model builds exactly these choices (a test holds the two together).

The megatron engine implements what megatron-core does; its limits are the megatron rules of the
catalogue. The torch engine is a small native PyTorch model: one device, fp32 or bf16 autocast,
the architecture choices below.
"""

ACTIVATIONS = ("silu", "gelu", "quick_gelu", "squared_relu")
"""model.activation_func's names: both engines build each (bridge.translate.build hands megatron-core its own function)."""
TORCH_NORMALIZATIONS = ("RMSNorm", "LayerNorm")
TORCH_ACTIVATIONS = ACTIVATIONS
TORCH_ROTARY_TYPES = ("rope", "yarn")
TORCH_POSITION_EMBEDDINGS = TORCH_ROTARY_TYPES + ("learned_absolute", "none")
TORCH_SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
TORCH_ROUTER_SCORE_FUNCTIONS = ("softmax", "sigmoid")
TORCH_OPTIMIZERS = ("adam",)
TORCH_LR_DECAY_STYLES = ("cosine", "linear", "constant")
TORCH_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router")
"""What make_graphed_callables can wrap in the native model under cuda_graph_impl=local."""
TORCH_NOT_MODELLED = ("attention_output_gate", "layernorm_zero_centered_gamma", "moe_shared_expert_gate",
                      "experimental_attention_variant")
"""model.* switches the native model does not implement (they must be off or unset)."""
TORCH_COMPILE_MODES = ("none", "default", "reduce-overhead")
PARALLEL_SIZES = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                  "expert_model_parallel_size")
