"""Data shipped with the package: hardware presets (`hardware/`)."""
