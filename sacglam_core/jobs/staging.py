"""Hugging Face models staged on the login node for compute nodes that run offline: which commit, and the
flag file that says a model is in the shared cache (`<hf_cache>/.staged/<owner>--<name>.done`)."""

from __future__ import annotations

from pathlib import Path

from sacglam_core.config import ModelConfig
from sacglam_core.pipeline.config import WorkflowConfig, WorkflowConfigError

FLAGS = ".staged"


def flag(hf_cache: Path, hub_id: str) -> Path:
    return Path(hf_cache) / FLAGS / (hub_id.replace("/", "--") + ".done")


def hub_id(flag_name: str) -> str:
    """The hub id of a flag's name (without its `.done`)."""
    return flag_name.replace("--", "/")


def revision(settings: WorkflowConfig, hub: str) -> str:
    """The pinned commit of a hub model; every staged model must have one (model_revisions)."""
    try:
        return settings.model_revisions[hub]
    except KeyError:
        raise WorkflowConfigError(
            f"workflow/config/config.yaml: model_revisions has no pinned commit for {hub}; add "
            f"`{hub}: <commit>` (the model's page on the Hub lists its commits)"
        ) from None


def model_inputs(model: ModelConfig, settings: WorkflowConfig) -> list[str]:
    """What a run needs of its model: the local folder, or the staged flag of its pinned hub model."""
    if model.is_local_path:
        return [model.name_or_path]
    revision(settings, model.name_or_path)
    return [str(flag(Path(settings.hf_cache), model.name_or_path))]
