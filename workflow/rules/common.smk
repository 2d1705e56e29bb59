# Input functions and naming shared by the rule files.


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
