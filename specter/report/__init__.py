"""Aggregation of run records into tidy tables (pandas) and figures (seaborn)."""

EXPERIMENTS = ("main", "k_sweep", "prefix_sweep", "routing", "working_set", "prefetch_policy", "ablation", "oracle",
               "budget", "hardware", "fidelity")
