# Config validation, input functions and naming shared by the rule files.
from pathlib import Path

from snakemake.utils import validate

validate(config, schema="../schemas/config.schema.yaml")

for _name, _spec in config["models"].items():
    if "path" in _spec and not (Path(_spec["path"]) / "config.json").is_file():
        raise ValueError(
            f"config models.{_name}.path: {_spec['path']!r} holds no checkpoint (no config.json); fix the path"
        )



def draft_name(d):
    return f"{d['method']}-int{d['bits']}-g{d['group_size']}"


def model_dir(name):
    """The checkpoint of model `name`: its configured path, or where the workflow builds it."""
    spec = config["models"][name]
    return spec["path"] if "path" in spec else f"results/models/{name}"


def all_fidelity_reports():
    return [
        f"results/fidelity/{model}/{draft_name(d)}.json" for model in config["models"] for d in config["drafts"]
    ]
