"""docs/configuration.md is the generator's output, and every configuration key is in it with a description."""

from dataclasses import asdict
from pathlib import Path

import pytest

from sacglam_core import reference
from sacglam_core.reports.tables import paper_config

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def _leaves(settings: dict, prefix: str = "") -> list[str]:
    """Every dotted key of a configuration, from its values (independent of the generator's walk)."""
    keys = []
    for name, value in settings.items():
        keys += _leaves(value, f"{prefix}{name}.") if isinstance(value, dict) else [prefix + name]
    return keys


def test_the_doc_is_the_generators_output():
    assert DOC.read_text(encoding="utf-8") == reference.markdown(), (
        f"docs/configuration.md is out of date with the configuration: run `{reference.COMMAND}` and commit it"
    )


def test_every_key_has_a_description():
    keys = reference.keys()
    assert len(keys) > 60
    missing = [key for key, info in keys.items() if not (info.description or "").strip()]
    assert not missing, f"fields without a docstring (the string below the field): {missing}"


@pytest.mark.parametrize("kind", ["ppo", "sac_her"])
def test_every_key_of_a_run_configuration_is_in_the_doc(kind):
    text = DOC.read_text(encoding="utf-8")
    keys = _leaves(asdict(paper_config(kind)))  # the paper's configurations set model.lora, so its keys show
    assert "model.lora.r" in keys
    missing = [key for key in keys if f"| `{key}` |" not in text]
    assert not missing, f"keys missing from docs/configuration.md: {missing}; run `{reference.COMMAND}`"


def test_types_defaults_and_the_papers_values():
    rows = {line.split(" | ")[0].strip("| `"): line for line in reference.markdown().splitlines() if "| `" in line}
    assert "| float > 0, <= 1 | `0.005` | `0.005` |" in rows["sac.critic.tau"]
    assert "one of `reverse_kl`, `forward_kl`" in rows["sac.actor_loss"]
    assert "`0.005` (SAC-GLAM); `0.05` (SAC-GLAM+HER)" in rows["sac.alpha_init"]
    assert "`false` (PPO-GLAM, SAC-GLAM); `true` (SAC-GLAM+HER)" in rows["her.enabled"]
    assert "| str | required | `google/flan-t5-base` |" in rows["model.name_or_path"]
    assert "| `null` | `{}` |" in rows["model.lora"]
    assert "PPO only." in rows["her.aligned_only"]
