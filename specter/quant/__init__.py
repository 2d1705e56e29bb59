"""Drafts: routed experts quantized by GPTQ (GPTQModel) or round-to-nearest, loaded over the target's shared weights."""
