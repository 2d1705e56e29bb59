"""Aggregation of run records into tidy tables (pandas: `tables`) and figures (seaborn: `figures`), one of each per
experiment of the registry (`specter.experiments`)."""
