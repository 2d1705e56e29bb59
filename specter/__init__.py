"""Specter suite: a benchmark and reproducibility suite for offloaded mixture-of-experts inference.

Reproduces Specter (arXiv 2511.14102, v1 "MoE-SpeQ") beside reimplemented baselines; see the README and DESIGN.md.
"""

__version__ = "0.1.0"

import logging as _logging

# transformers imports torchao (a GPTQModel dependency) whenever it is installed; on a machine without CUDA torchao
# logs a
# warning per missing CUDA kernel, and torch warns about torchao's enums. Neither concerns this suite.
for _name in ("torchao", "torch.utils._pytree"):
    _logging.getLogger(_name).setLevel(_logging.ERROR)
