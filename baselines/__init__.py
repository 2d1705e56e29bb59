"""Reimplemented baseline systems, one file each; each is a `specter.systems.System` registered by name."""
