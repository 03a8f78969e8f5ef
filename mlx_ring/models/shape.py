"""A model's shape (hidden size, layers, heads, MLP and experts, tied head, context) read from
its config.json in one place, for the planner (`planning/sizes.py`), the tensor cutter
(`tensor/shares.py`) and Ollama's /api/show, so that none of them reads the file its own way.

Read as mlx-lm reads it: from the arguments of the model mlx-lm builds for the config (lazily:
no weight is made), its defaults included; from the config's own keys where mlx-lm cannot build it.
Only reading imports MLX: the HTTP side holds a ModelShape without it.
"""

import json
import re
from dataclasses import dataclass
from functools import lru_cache

# What building a model from a config mlx-lm cannot take raises (an unknown type, a missing key).
UNBUILDABLE = (
    ValueError,
    KeyError,
    TypeError,
    AttributeError,
    AssertionError,
    NotImplementedError,
    ZeroDivisionError,
    IndexError,
)

# Each size by every name that configs (and mlx-lm's arguments) give it, the usual one first.
HIDDEN = ("hidden_size", "d_model", "n_embd", "dim", "model_dim")
LAYERS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers")
HEADS = ("num_attention_heads", "n_heads", "num_heads", "n_head")
KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
# LFM2's block_ff_dim first: mlx-lm takes its intermediate_size only where block_ff_dim is missing.
WIDTH = ("block_ff_dim", "intermediate_size", "ffn_hidden_size", "n_inner")
VOCAB = ("vocab_size", "padded_vocab_size", "num_vocab")
EXPERTS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
EXPERTS_PER_TOKEN = (
    "num_experts_per_tok",
    "moe_topk",
    "moe_top_k",
    "top_k_experts",
    "num_experts_per_token",
    "moe_k",
)
EXPERT_WIDTH = ("moe_intermediate_size", "expert_intermediate_size")
SHARED = ("n_shared_experts", "num_shared_experts")
# (not MiniMax's shared_intermediate_size: its mlx-lm model has no shared expert, whatever it says)
SHARED_WIDTH = ("shared_expert_intermediate_size",)
# The head's own weights, outside the layers (internlm2 and llama4_text name it `output`).
HEAD_WEIGHTS = re.compile(r"(?:^|\.)(?:lm_head|output)(?:\.|$)")
IN_LAYER = re.compile(r"(?:^|\.)layers\.\d+\.")


@dataclass(frozen=True)
class ModelShape:
    """A model's shape as its config.json gives it, mlx-lm's defaults filling in what it leaves
    out; a size neither names is 0."""

    model_type: str  # the top level's: the type mlx-lm picks the model's classes by
    hidden_size: int
    layers: int
    heads: int  # query heads of a layer
    kv_heads: int
    head_dim: int
    intermediate_size: int  # the dense MLP's width
    vocab_size: int
    tied: bool  # the head is the embedding, with no weights of its own
    experts: int = 0  # routed experts of a layer (0: a dense model)
    experts_per_token: int = 1
    expert_width: int = 0  # each routed expert's MLP width
    shared_experts: int = 0  # experts every token reads, as wide as a routed one (DeepSeek, GLM)
    shared_expert_width: int = 0  # the shared expert's own width (Qwen2-MoE, Qwen3-Next)
    kv_lora_rank: int = 0  # latent attention's compressed vector (DeepSeek-V2/V3); 0: none
    rope_head_dim: int = 0  # latent attention's rotary key, cached beside the compressed vector
    attention_bias: bool = False
    context_length: int = 4096
    dtype: str = "float16"  # the float type the config names


def text_keys(config: dict) -> dict:
    """The text model's keys: a vision-language wrapper's `text_config` over its top level, as
    mlx-lm builds the text model from `text_config` (the top level fills only what it lacks); the
    top level's model_type stays, as it picks the classes."""
    text = config.get("text_config")
    text = text if isinstance(text, dict) else {}
    return {**config, **text, "model_type": config.get("model_type")}


def read_shape(config: dict) -> ModelShape:
    """The shape of the model `config` (a config.json) describes."""
    return _read(json.dumps(config, sort_keys=True, default=str))


@lru_cache(maxsize=32)
def _read(text: str) -> ModelShape:
    config = json.loads(text)
    keys = text_keys(config)
    model = _built(json.loads(text))  # its own copy: a wrapper's arguments edit text_config
    args = _text_args(model) if model is not None else {}

    def first(names: tuple, default: int = 0) -> int:
        # mlx-lm's arguments first (they hold its defaults), then the config's own keys
        for source in (args, keys):
            found = next((source[n] for n in names if _size(source.get(n))), None)
            if found is not None:
                return found
        return default

    hidden, heads, latent = first(HIDDEN), first(HEADS), first(("kv_lora_rank",))
    # A missing KV head count is the query heads' (mlx-lm's llama-style ModelArgs default it so).
    # Latent attention decompresses keys and values for every query head: its KV head argument is
    # used nowhere (deepseek_v3's default of 32 is no part of the model).
    kv = heads if latent else first(KV_HEADS, heads)
    # A missing head_dim is hidden / heads, as mlx-lm's llama-style attention takes it (a type
    # with its own default, gemma3_text's 256, has it in its arguments).
    head_dim = first(("head_dim",), hidden // heads if heads else 0)
    bias = args.get("attention_bias", keys.get("attention_bias"))
    # As mlx_lm.convert picks the dtype: the top level's torch_dtype, then text_config's.
    dtype = (
        config.get("torch_dtype")
        or config.get("dtype")
        or keys.get("torch_dtype")
        or keys.get("dtype")
        or "float16"
    )
    return ModelShape(
        model_type=str(config.get("model_type") or ""),
        hidden_size=hidden,
        layers=len(getattr(model, "layers", ())) or first(LAYERS),
        heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=first(WIDTH),
        vocab_size=first(VOCAB),
        tied=_tied(model, keys),
        experts=first(EXPERTS),
        experts_per_token=first(EXPERTS_PER_TOKEN, 1),
        expert_width=first(EXPERT_WIDTH),
        shared_experts=first(SHARED),
        shared_expert_width=first(SHARED_WIDTH),
        kv_lora_rank=latent,
        rope_head_dim=first(("qk_rope_head_dim",)),
        attention_bias=bool(bias),
        # The context as served: mlx-lm's defaults of it (DeepSeek-V3's 2048) only seed RoPE.
        context_length=_size(keys.get("max_position_embeddings")) or 4096,
        dtype=str(dtype),
    )


def _size(v) -> int:
    """`v` where it is a size (a positive int, not a bool), else 0."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def _built(config: dict):
    """The model mlx-lm builds for `config` (lazily: nothing allocated), or None where it cannot."""
    from mlx_ring.models.compat import model_classes

    try:
        model_cls, args_cls = model_classes(config)
        return model_cls(args_cls.from_dict(config))
    except UNBUILDABLE:
        return None


def _text_args(model) -> dict:
    """The arguments of the text model in `model`: the first, nearest the top, that give a hidden
    size (a wrapper's own arguments hold only its `text_config`); {} where none does."""
    level = [model]
    for _ in range(4):
        for m in level:
            args = getattr(m, "args", None) or getattr(m, "config", None)
            if hasattr(args, "__dict__") and any(_size(getattr(args, n, None)) for n in HIDDEN):
                return vars(args)
        level = [c for m in level for c in m.children().values() if hasattr(c, "children")]
    return {}


def _tied(model, keys: dict) -> bool:
    """Whether the head is the embedding. mlx-lm's default differs by type (llama's and
    qwen2's True, mixtral's and phi3's False), and some types ignore the key (DeepSeek and
    Qwen2-MoE always have a head, Gemma never, pixtral forces one), so: whether the model
    mlx-lm builds has head weights of its own. gemma3_text drops its head only on finding none
    in the weights: untied here."""
    if model is not None:
        from mlx.utils import tree_flatten

        params = tree_flatten(model.parameters())
        return not any(HEAD_WEIGHTS.search(p) and not IN_LAYER.search(p) for p, _ in params)
    # Where mlx-lm cannot build it: the config's word, else a head of its own (the larger count,
    # so that a plan never comes short).
    tied = keys.get("tie_word_embeddings")
    return tied if isinstance(tied, bool) else False
