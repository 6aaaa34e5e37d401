"""config.example.toml documents every key config.py reads: each table's keys with their
defaults, nested tables too, and the built-in adapters' `[plugins.<name>]` tables, which are shown
commented out (some of their keys have no default a TOML file can write). A key missing from the
example fails naming it; a key config.py does not know fails to load."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import msgspec

from appliance.config import BUILTIN_PLUGIN_SETTINGS, Config, PluginsConfig, load_config

EXAMPLE = Path(__file__).resolve().parent.parent / "config.example.toml"
# A commented-out setting: `# [table]` (a comment may follow) or `# key = value`, never prose.
COMMENTED_SETTING = re.compile(r"# (\[[\w.]+\](\s+#.*)?|\w+ = .+)")


def config_keys(struct: type[msgspec.Struct], prefix: str = "") -> Iterator[str]:
    """Every dotted key of the struct and the structs nested in it, but the plugins' own tables."""
    for field in msgspec.structs.fields(struct):
        if isinstance(field.type, type) and issubclass(field.type, msgspec.Struct):
            yield from config_keys(field.type, f"{prefix}{field.encode_name}.")
        elif (struct, field.name) != (PluginsConfig, "tables"):
            yield f"{prefix}{field.encode_name}"


def documented_keys(table: dict, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, value in table.items():
        keys.add(f"{prefix}{name}")
        if isinstance(value, dict):
            keys |= documented_keys(value, f"{prefix}{name}.")
    return keys


def uncommented(text: str) -> str:
    """The example with its commented-out settings put back."""
    return "\n".join(line[2:] if COMMENTED_SETTING.fullmatch(line) else line for line in text.splitlines())


def test_the_example_loads_and_shows_every_default():
    assert load_config(EXAMPLE) == Config()


def test_the_commented_out_settings_load_when_uncommented(tmp_path):
    settings = tmp_path / "uncommented.toml"
    settings.write_text(uncommented(EXAMPLE.read_text()))
    tables = load_config(settings).plugins.tables  # each built-in table checked by its struct
    assert set(BUILTIN_PLUGIN_SETTINGS) <= set(tables)


def test_the_example_holds_every_key_config_reads():
    documented = documented_keys(tomllib.loads(uncommented(EXAMPLE.read_text())))
    missing = [key for key in config_keys(Config) if key not in documented]
    # A struct shared by several built-in tables: each of its keys in the table(s) that read it.
    for struct in dict.fromkeys(BUILTIN_PLUGIN_SETTINGS.values()):
        tables = [name for name, settings in BUILTIN_PLUGIN_SETTINGS.items() if settings is struct]
        missing += [f"plugins.{name}" for name in tables if f"plugins.{name}" not in documented]
        missing += [f"plugins.{'|'.join(tables)}.{field.encode_name}" for field in msgspec.structs.fields(struct)
                    if not any(f"plugins.{name}.{field.encode_name}" in documented for name in tables)]
    assert not missing, f"not in config.example.toml: {', '.join(missing)}"
