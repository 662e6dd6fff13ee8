"""The GLAM agent: LLM policy over candidate actions (paper section 2.1), critic heads (Appendix B)."""

from sacglam_core.agent.agent import AgentConfig, GlamAgent
from sacglam_core.agent.batch import CandidateBatch
from sacglam_core.agent.critic import Critic, ValueHead
from sacglam_core.agent.lm import GlamLM, LMOutput
from sacglam_core.agent.policy import CandidateDistribution
from sacglam_core.config import CriticConfig

__all__ = [
    "AgentConfig",
    "CandidateBatch",
    "CandidateDistribution",
    "Critic",
    "CriticConfig",
    "GlamAgent",
    "GlamLM",
    "LMOutput",
    "ValueHead",
]
