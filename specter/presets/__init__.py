"""Data shipped with the package: hardware presets (`hardware/`), published figures (`paper/`, `claims/`, `routing/`),
architectures (`architectures/`)."""


def routing_published() -> tuple[dict, list[dict]]:
    """Real models' published routing statistics, their sources and rows (`routing/published.yaml`)."""
    from importlib.resources import files

    import yaml

    data = yaml.safe_load(files(__name__).joinpath("routing", "published.yaml").read_text(encoding="utf-8"))
    return data["sources"], data["rows"]
