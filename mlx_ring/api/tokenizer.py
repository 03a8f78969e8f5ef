"""The served tokenizer in the HTTP process, without MLX: mlx-lm's tokenizer wrapper, its chat
templates and tool parsers are plain Python over transformers, but importing any part of mlx_lm
runs its package's __init__, which imports MLX; so the package is entered here without it."""

import importlib
import importlib.util
import sys
import types
from pathlib import Path


def mlx_lm_part(name: str):
    """`mlx_lm.<name>`, imported without running mlx_lm/__init__.py (in a process that has not
    imported mlx_lm itself)."""
    if "mlx_lm" not in sys.modules:
        spec = importlib.util.find_spec("mlx_lm")
        if spec is None or not spec.submodule_search_locations:
            raise ValueError("mlx-lm is not installed here; install the project's environment")
        package = types.ModuleType("mlx_lm")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["mlx_lm"] = package
    return importlib.import_module(f"mlx_lm.{name}")


def load_tokenizer(model_path: str, eos_token_ids: list[int], defaults: dict | None):
    """mlx-lm's TokenizerWrapper as `mlx_lm.utils.load_tokenizer` makes it; `defaults`: the
    model module's TOKENIZER_DEFAULTS, which only the engine process can read (they live beside
    the model's MLX code)."""
    utils = mlx_lm_part("tokenizer_utils")
    return utils.load(Path(model_path), eos_token_ids=eos_token_ids, defaults=defaults)


class GrammarCheck:
    """The served tokenizer as llguidance sees it, to check a constrained answer's grammar on
    the HTTP side (`serving.grammar.Grammars.check`; the engine makes the processors)."""

    def __init__(self, tokenizer, n_vocab: int):
        import llguidance.hf

        self.tokenizer = llguidance.hf.from_tokenizer(
            tokenizer._tokenizer, n_vocab=n_vocab, eos_token=sorted(tokenizer.eos_token_ids)
        )

    def check(self, grammar: str) -> str:
        """'' when the grammar can be enforced, else why not (the keyword, as llguidance names
        it)."""
        from llguidance import LLMatcher

        try:
            return LLMatcher.validate_grammar(grammar, self.tokenizer)
        except Exception as e:  # a grammar that does not even parse
            return str(e)
