"""The YAML a hardware profile is read with: no anchors or aliases, no key twice, numbers as plain decimals and
booleans as true or false (YAML 1.1's other spellings refused, each with its place)."""

from __future__ import annotations

import yaml

from specter.io import plain_numbers


class AliasRefused(yaml.MarkedYAMLError):
    """An anchor or alias in a profile."""


class ProfileLoader(yaml.SafeLoader):
    """YAML without anchors and aliases: a profile never needs them, and a few KB of nested aliases expand to
    gigabytes (a 2.8 KB alias bomb made a 69 MB JSONL)."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise AliasRefused(problem_mark=event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        """A mapping, refused where a key appears twice: YAML keeps the last, and a profile that says `memory_gb: 40`
        and then `memory_gb: 80` ran at 80 under the name it gave."""
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                twice = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class refuses it
                continue
            if twice:
                raise yaml.constructor.ConstructorError(problem=f"the key {key!r:.40} appears twice in one mapping",
                                                        problem_mark=key_node.start_mark)
        return super().construct_mapping(node, deep)


plain_numbers(ProfileLoader)


def _boolean(loader, node):
    """true or false only: YAML 1.1 also reads yes, no, on and off as booleans, as it reads 0x19 as a number."""
    if node.value not in ("true", "True", "TRUE", "false", "False", "FALSE"):
        raise yaml.constructor.ConstructorError(problem=f"{node.value!r:.40} is a boolean only YAML 1.1 reads; write "
                                                "true or false", problem_mark=node.start_mark)
    return node.value.lower() == "true"


ProfileLoader.add_constructor("tag:yaml.org,2002:bool", _boolean)
