"""Strict YAML for the workflow's own files: every problem is one line naming the file, the key and the line.

PyYAML (YAML 1.1) keeps the last of two equal keys without a word, reads `time_min: 20:00:00` as the
base-60 number 72000 and an empty file as nothing at all. Here each of these is an error, and so is an
example's placeholder left in (`partition: <your partition>`).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

SEXAGESIMAL = re.compile(r"^[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?$")
NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
PLACEHOLDER = re.compile(r"^<[^<>]*>$")  # `<your partition>`, unquoted, in an example file


class YamlFileError(ValueError):
    """A YAML file that cannot be used; the message names the file (and the key and line)."""


def _check(node: yaml.Node, where: str, keys: tuple[str, ...] = ()) -> None:
    """Duplicate keys and base-60 numbers anywhere under `node`."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            dotted = ".".join((*keys, key))
            if key in seen:
                raise YamlFileError(f"{where}:{line}: duplicate key {dotted} (first at line {seen[key]})")
            seen[key] = line
            _check(value_node, where, (*keys, key))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _check(item, where, (*keys, str(index)))
    elif node.tag == "tag:yaml.org,2002:str" and PLACEHOLDER.match(str(node.value)) and node.style is None:
        raise YamlFileError(
            f"{where}:{node.start_mark.line + 1}: {'.'.join(keys)}: {node.value} is a placeholder of the example "
            f"file: set your value (or null where the comment allows it)"
        )
    elif node.tag in NUMBER_TAGS and SEXAGESIMAL.match(str(node.value)):
        raise YamlFileError(
            f"{where}:{node.start_mark.line + 1}: {'.'.join(keys)}: {node.value} is read by YAML as the base-60 "
            f"number {yaml.safe_load(node.value)}; {_time_advice(str(node.value))}"
        )


def _time_advice(value: str) -> str:
    """How to write the time `value` meant: plain minutes, or SLURM's HH:MM:SS quoted. A quoted "20:00" would be
    20 minutes to SLURM (MM:SS), so a two-part value is taken as the hours and minutes it most likely means."""
    parts = value.lstrip("+").replace("_", "").split(":")
    if len(parts) not in (2, 3) or not all(part.isdigit() for part in parts):
        return "write plain minutes"
    hours, minutes, seconds = (int(part) for part in (parts + ["0"])[:3])
    total = hours * 60 + minutes + (seconds + 59) // 60
    advice = f'write plain minutes ({total}) or quote SLURM\'s HH:MM:SS ("{hours}:{minutes:02d}:{seconds:02d}")'
    return advice + (f' (a quoted "{value}" is {hours} minutes {minutes} seconds to SLURM)' if len(parts) == 2 else "")


def load(path: str | Path, what: str = "YAML file") -> dict:
    """The YAML mapping in `path`; `what` says what the file is for, in messages."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise YamlFileError(f"{what} {path} does not exist") from None
    except UnicodeDecodeError as error:
        line = error.object[: error.start].count(b"\n") + 1
        raise YamlFileError(
            f"{what} {path}:{line}: not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start}); "
            "save it as UTF-8"
        ) from None
    except OSError as error:
        raise YamlFileError(f"cannot read {what} {path}: {error.strerror}") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _check(node, str(path))
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as error:
        raise YamlFileError(f"{what} {path} is not valid YAML: {' '.join(str(error).split())}") from None
    finally:
        loader.dispose()
    if data is None:
        raise YamlFileError(f"{what} {path} is empty")
    if not isinstance(data, dict):
        raise YamlFileError(f"{what} {path} must hold a mapping of keys, not a {type(data).__name__}")
    return data
