"""Models: the adapter over stock transformers MoE classes, loading, and tiny test models."""

from specter.models.adapter import ARCHITECTURES, MoELayer, MoEModel, Routing
from specter.models.experts import Activation, ExpertWeights, expert_ffn
from specter.models.loading import ModelSummary, describe_model, load_moe_model, read_model_config

__all__ = [
    "ARCHITECTURES",
    "Activation",
    "ExpertWeights",
    "MoELayer",
    "MoEModel",
    "ModelSummary",
    "Routing",
    "describe_model",
    "expert_ffn",
    "load_moe_model",
    "read_model_config",
]
