"""anchorlens: measure attention anchors (instance tokens, CaPT capsules, soft prompts) in language models.

The public API is re-exported here and imported lazily, so ``import anchorlens`` (and the CLI's
``--help``) stays fast; the first attribute access imports torch and transformers. The functions
come with their arguments checked against their annotations (:mod:`anchorlens.arguments`): a wrong
type is one ``UsageError`` (also a ``TypeError``) naming the argument and the accepted types.
"""

from __future__ import annotations

import importlib
import inspect as _inspect
import warnings
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # inputs and roles
    "Role": "anchorlens.roles.kinds",
    "Template": "anchorlens.roles.templates",
    "get_task": "anchorlens.tasks",
    "load_examples": "anchorlens.tasks",
    "bundled_examples": "anchorlens.tasks",
    # models and guidance
    "load_base": "anchorlens.models.loading",
    "load_guided": "anchorlens.methods.spec",
    "GuidedModel": "anchorlens.methods.guided",
    "SoftPrompt": "anchorlens.methods.soft_prompt",
    "DeepPrompt": "anchorlens.methods.deep_prompt",
    "InstanceToken": "anchorlens.methods.instance",
    "Capsule": "anchorlens.methods.capsule",
    "save_checkpoint": "anchorlens.methods.checkpoints",
    "load_checkpoint": "anchorlens.methods.checkpoints",
    "load_peft": "anchorlens.methods.peft_import",
    # capture and statistics
    "Selection": "anchorlens.capture.selection",
    "AttentionMaps": "anchorlens.capture.maps",
    "make_reducer": "anchorlens.analyses.registry",
    "register_reducer": "anchorlens.analyses.registry",
    "metrics_frame": "anchorlens.analyses",
    "capture_statistics": "anchorlens.workflows.statistics",
    # workflows
    "inspect": "anchorlens.notebook.inspect",
    "attention_view": "anchorlens.notebook.widget",
    "load_comparison": "anchorlens.reports.comparison",
    "compare": "anchorlens.workflows.compare",
    "sweep_positions": "anchorlens.workflows.positions",
    "train": "anchorlens.workflows.train",
    "evaluate": "anchorlens.workflows.evaluate",
    "UsageError": "anchorlens.errors",
    "ArgumentTypeError": "anchorlens.errors",
}
# Parameters whose annotation is narrower than what the function takes.
_ACCEPTS: dict[str, dict[str, str]] = {
    "sweep_positions": {"positions": "str | Sequence[str]"},  # "first,last" as on the command line
    "compare": {"dtype": "str | torch.dtype | None"},  # handed to load_base, which takes both
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    """Import a public name on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'anchorlens' has no attribute {name!r}")
    with warnings.catch_warnings():
        # transformers imports tqdm.auto, which warns "IProgress not found" in a Jupyter kernel without
        # ipywidgets (the `jupyter` extra installs it) and then uses plain text bars: nothing to act on.
        warnings.filterwarnings("ignore", message="IProgress not found", module="tqdm")
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    if _inspect.isfunction(value):
        from anchorlens.arguments import checked

        value = checked(value, public_name=f"anchorlens.{name}", overrides=_ACCEPTS.get(name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
