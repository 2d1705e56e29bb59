"""Offloading: the model's work in cost terms, the device memory plan, the expert cache and the MoE layer executor."""
