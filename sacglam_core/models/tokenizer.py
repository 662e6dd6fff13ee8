"""A word-level tokenizer trained on the environment's vocabulary, for the project's tiny models."""

from __future__ import annotations

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from sacglam_core.envs.goals import catalog
from sacglam_core.envs.objects import KINDS
from sacglam_core.envs.playground import GO_TO_TEXT, GRASP, RELEASE_ALL, RELEASE_TEXT, prompt

PAD, EOS, UNK, BOS = "<pad>", "</s>", "<unk>", "<s>"
SPECIAL_TOKENS = [PAD, EOS, UNK, BOS]  # T5's convention: pad=0, eos=1, unk=2


def environment_corpus() -> list[str]:
    """Every word the environment can show: goals of both splits, objects, actions, prompt text."""
    objects = ", ".join(k.name for k in KINDS)
    observation = f"You see: {objects}\nYou are on: nothing\nYou are holding: {objects}\nYou have grown: nothing"
    goals = catalog()
    return [prompt(goal, observation) for goal in goals.goals("train") + goals.goals("test")] + [
        GRASP,
        RELEASE_ALL,
        *GO_TO_TEXT,
        *RELEASE_TEXT,
    ]


def build_tokenizer(add_eos: bool, extra: list[str] | None = None) -> PreTrainedTokenizerFast:
    """Lower-cased words and punctuation of the environment (and of the `extra` text, for a model pre-trained on
    it); `add_eos` appends `</s>` (T5 style), else prepends `<s>`."""
    tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(
        environment_corpus() + list(extra or []),
        trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS, show_progress=False),
    )
    template = f"$A {EOS}" if add_eos else f"{BOS} $A"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(t, tokenizer.token_to_id(t)) for t in (EOS, BOS)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, unk_token=UNK, bos_token=BOS
    )
