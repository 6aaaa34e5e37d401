"""Loading plugins: built-in adapter modules and the `.py` files / packages of the plugin folders,
registered the same way, into one `Registry` the rest of the app asks for adapters by name.

A plugin is loaded explicitly at start (never by importing it from somewhere else), under the
module name `appliance_plugins.<stem>`, and registered with pluggy under its own stem. Anything
wrong with it (import error, syntax error, unknown or misspelt hook, a hook that raises or returns
something other than a list of adapters, an adapter of another major API version, an adapter name
already taken) is recorded in `Registry.load_report` and logged, and the plugin is skipped as a
whole; with `[plugins] strict = true` the first such problem raises `PluginError` instead.

Adapter hooks get the plugin's own `[plugins.<stem>]` table as `settings`, so each hook
implementation is called on its own rather than through `pm.hook.<name>()`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import sys
import traceback
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from appliance import sdk

if TYPE_CHECKING:
    from appliance.config import Config
    from appliance.domain.campaign import Condition

log = logging.getLogger("appliance.plugins")

# Built-in adapter modules, registered before the plugin folders and exactly like a plugin (each
# is imported and registered under the last part of its module name, and gets its own
# `[plugins.<that name>]` table). To add a built-in: write a module under appliance/adapters/
# with `@sdk.hookimpl` functions for the adapter hooks and list it here.
BUILTIN_MODULES: tuple[str, ...] = (
    "appliance.adapters.http_delivery",   # delivery adapter "http"
    "appliance.adapters.twilio",          # SMS provider "twilio"
    "appliance.adapters.telnyx",          # SMS provider "telnyx"
    "appliance.adapters.meta_capi",       # pixel platform "social" (Meta Conversions API)
    "appliance.adapters.tiktok_events",   # pixel platform "video" (TikTok Events API)
    "appliance.adapters.demo_buyer",      # delivery adapter "demo" (accepts every lead; `appliance demo`)
    "appliance.adapters.documenso",       # e-signature adapter "documenso" (Documenso's public API v1)
    "appliance.adapters.phone_verifier",  # verifier "phone" (the phone number library, offline)
    "appliance.adapters.http_lookup",     # verifier "http_lookup" (a JSON lookup service)
)

# Package under which plugin files are imported; it exists only in sys.modules.
NAMESPACE = "appliance_plugins"
DEFAULT_DIR = Path("plugins")

ADAPTER_HOOKS: dict[str, tuple[str, type]] = {
    # kind -> (hook name, base class)
    "delivery": ("appliance_delivery_adapters", sdk.DeliveryAdapter),
    "sms": ("appliance_sms_providers", sdk.SmsProvider),
    "pixel": ("appliance_pixel_platforms", sdk.PixelPlatform),
    "esign": ("appliance_esign_adapters", sdk.EsignAdapter),
    "verifier": ("appliance_verifiers", sdk.Verifier),
}
# The method each kind of adapter must implement (the base class only raises NotImplementedError).
_REQUIRED_METHOD = {"delivery": "deliver", "sms": "send", "pixel": "fire", "esign": "send", "verifier": "verify"}


class PluginError(Exception):
    """A plugin failed to load while `[plugins] strict` is on."""


@dataclass
class PluginReport:
    """One loaded (or refused) plugin, or a missing plugin folder (`name` None)."""

    name: str | None
    file: str
    provides: list[tuple[str, str]] = field(default_factory=list)  # (kind, adapter name)
    hooks: list[str] = field(default_factory=list)  # the hooks it implements, by name
    error: str | None = None
    builtin: bool = False


@dataclass(frozen=True)
class AdapterEntry:
    kind: str      # "delivery", "sms", "pixel", "esign" or "verifier"
    name: str
    plugin: str
    file: str
    adapter: Any


class Registry:
    """Adapters by kind and name, the plugin manager holding every plugin that loaded, and what
    happened to each plugin."""

    def __init__(self, tables: Mapping[str, dict] | None = None) -> None:
        self.pm = pluggy.PluginManager(sdk.PROJECT)
        self.pm.add_hookspecs(sdk.HookSpecs)
        self.delivery_adapters: dict[str, sdk.DeliveryAdapter] = {}
        self.sms_providers: dict[str, sdk.SmsProvider] = {}
        self.pixel_platforms: dict[str, sdk.PixelPlatform] = {}
        self.esign_adapters: dict[str, sdk.EsignAdapter] = {}
        self.verifiers: dict[str, sdk.Verifier] = {}
        self.entries: list[AdapterEntry] = []
        self.load_report: list[PluginReport] = []
        self.dirs: list[Path] = []
        self._tables: Mapping[str, dict] = tables or {}

    # ---- lookups --------------------------------------------------------------------------------

    def _by_kind(self, kind: str) -> dict[str, Any]:
        return {"delivery": self.delivery_adapters, "sms": self.sms_providers, "pixel": self.pixel_platforms,
                "esign": self.esign_adapters, "verifier": self.verifiers}[kind]

    def delivery_adapter(self, name: str) -> sdk.DeliveryAdapter | None:
        return self.delivery_adapters.get(name)

    def sms_provider(self, name: str) -> sdk.SmsProvider | None:
        return self.sms_providers.get(name)

    def pixel_platform(self, name: str) -> sdk.PixelPlatform | None:
        return self.pixel_platforms.get(name)

    def esign_adapter(self, name: str) -> sdk.EsignAdapter | None:
        return self.esign_adapters.get(name)

    def verifier(self, name: str) -> sdk.Verifier | None:
        return self.verifiers.get(name)

    def plugin_of(self, kind: str, name: str) -> str | None:
        """The plugin that brought the adapter (for its error reports)."""
        return next((e.plugin for e in self.entries if e.kind == kind and e.name == name), None)

    def adapter_settings(self, kind: str, name: str) -> dict:
        """The `[plugins.<plugin>]` table of the plugin that provides adapter `name` of `kind`
        (what `DeliveryRequest.settings` etc. should carry); empty when unknown."""
        for entry in self.entries:
            if entry.kind == kind and entry.name == name:
                return dict(self._tables.get(entry.plugin, {}))
        return {}

    @property
    def errors(self) -> list[PluginReport]:
        return [r for r in self.load_report if r.error is not None]

    # ---- hooks the app calls --------------------------------------------------------------------

    def call_intake_action(self, action: sdk.IntakeAction) -> list[str]:
        """Run every plugin's `appliance_intake_action`; failures come back as strings, never raised."""
        problems: list[str] = []
        for impl in self.pm.hook.appliance_intake_action.get_hookimpls():
            try:
                result = impl.function(**_arguments(impl, action=action))
                if inspect.isawaitable(result):
                    if inspect.iscoroutine(result):
                        result.close()
                    raise TypeError("returned an awaitable; hooks are plain functions")
            except Exception as exc:  # a plugin's bug must not fail the submission
                problem = f"{impl.plugin_name}: {self.describe_error(exc, impl.plugin_name)}"
                log.warning("plugin intake action failed: %s\n%s", problem, self._stack(exc, impl.plugin_name))
                problems.append(problem)
        return problems

    @property
    def listens_to_lead_events(self) -> bool:
        return bool(self.pm.hook.on_lead_event.get_hookimpls())

    def call_lead_event(self, tenant_id: str, event: dict[str, Any]) -> None:
        """Every plugin's `on_lead_event`; a plugin that raises is logged with its traceback, and
        the others still get the event."""
        for impl in self.pm.hook.on_lead_event.get_hookimpls():
            try:
                result = impl.function(**_arguments(impl, tenant_id=tenant_id, event=event))
                if inspect.iscoroutine(result):
                    result.close()
                    raise TypeError("returned an awaitable; hooks are plain functions")
            except Exception as exc:  # a plugin's bug must not hold up the events
                log.error("plugin %s: on_lead_event(%s) raised %s\n%s", impl.plugin_name, event.get("type"),
                          self.describe_error(exc, impl.plugin_name), self._stack(exc, impl.plugin_name))

    def prompt_evaluator(self) -> Callable[[Condition, dict], bool | None] | None:
        """The evaluator for `prompt` rule conditions, or None when no plugin implements one."""
        hook = self.pm.hook.appliance_evaluate_prompt
        if not hook.get_hookimpls():
            return None

        def evaluate(condition: Condition, facts: dict) -> bool | None:
            try:
                verdict = hook(prompt=condition.prompt or "", facts=dict(facts))
            except Exception as exc:  # no verdict: the condition is skipped
                log.warning("prompt evaluator failed: %s\n%s", _redact(_one_line(exc), self._tables),
                            _redact("".join(traceback.format_exception(exc)).rstrip(), self._tables))
                return None
            return None if verdict is None else bool(verdict)

        return evaluate

    # ---- loading --------------------------------------------------------------------------------

    def _stack(self, exc: BaseException, plugin: str | None) -> str:
        """The traceback, with the plugin's configured values blanked out."""
        return _redact("".join(traceback.format_exception(exc)).rstrip(), self._tables.get(plugin or "", {}))

    def describe_error(self, exc: BaseException, plugin: str | None) -> str:
        """`Type: message` on one line, with the plugin's configured values blanked out."""
        return _redact(_one_line(exc), self._tables.get(plugin or "", {}))

    def register(self, module: types.ModuleType, name: str, file: str, *, builtin: bool = False) -> PluginReport:
        """Register one imported module as plugin `name`: all of its adapters, or none of them."""
        report = PluginReport(name, file, builtin=builtin)
        if self.pm.has_plugin(name):
            report.error = f"a plugin named {name!r} is already registered"
            return report
        try:
            self.pm.register(module, name=name)
        except Exception as exc:  # pluggy refuses hook implementations that do not fit their spec
            report.error = _one_line(exc)
            return report
        try:
            found = self._collect(module, name)
        except _Refused as exc:
            self.pm.unregister(module, name=name)
            report.error = str(exc)
            return report
        for kind, adapter in found:
            self._by_kind(kind)[adapter.name] = adapter
            self.entries.append(AdapterEntry(kind, adapter.name, name, file, adapter))
            report.provides.append((kind, adapter.name))
        report.hooks = sorted(caller.name for caller in self.pm.get_hookcallers(module) or [] if caller.spec)
        return report

    def _collect(self, module: types.ModuleType, name: str) -> list[tuple[str, Any]]:
        for caller in self.pm.get_hookcallers(module) or []:
            mine = [i for i in caller.get_hookimpls() if i.plugin is module]
            if caller.spec is None and not all(i.optionalhook for i in mine):
                raise _Refused(f"unknown hook {caller.name!r} (the hooks are in appliance.sdk.HookSpecs)")
        settings = self._tables.get(name, {})
        found: list[tuple[str, Any]] = []
        taken = {(e.kind, e.name): e.plugin for e in self.entries}
        for kind, (hook_name, base) in ADAPTER_HOOKS.items():
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                if impl.plugin is not module:
                    continue
                try:
                    result = impl.function(**_arguments(impl, settings=dict(settings)))
                except Exception as exc:
                    raise _Refused(f"{hook_name} raised {self.describe_error(exc, name)}") from None
                if not isinstance(result, (list, tuple)):
                    raise _Refused(f"{hook_name} must return a list of adapters, not {type(result).__name__}")
                for adapter in result:
                    _check_adapter(kind, base, hook_name, adapter)
                    owner = taken.get((kind, adapter.name))
                    if owner is not None:
                        raise _Refused(f"{kind} adapter name {adapter.name!r} is already registered "
                                       f"by plugin {owner!r}")
                    taken[(kind, adapter.name)] = name
                    found.append((kind, adapter))
        return found


class _Refused(Exception):
    pass


def _check_adapter(kind: str, base: type, hook_name: str, adapter: Any) -> None:
    if not isinstance(adapter, base):
        raise _Refused(f"{hook_name} returned {type(adapter).__name__}, not a {base.__name__}")
    label = type(adapter).__name__
    adapter_name = getattr(adapter, "name", None)
    if not isinstance(adapter_name, str) or not adapter_name.strip():
        raise _Refused(f"{label} has no name (set the class attribute `name`)")
    version = getattr(adapter, "api_version", None)
    major = _major(version)
    if major != sdk.API_VERSION:
        raise _Refused(f"{kind} adapter {adapter_name!r} is built for plugin API version {version!r}; "
                       f"this appliance speaks version {sdk.API_VERSION}")
    method = _REQUIRED_METHOD[kind]
    if getattr(type(adapter), method, None) is getattr(base, method):
        raise _Refused(f"{kind} adapter {adapter_name!r} does not implement {method}()")


def _major(version: Any) -> int | None:
    if isinstance(version, bool):
        return None
    if isinstance(version, int):
        return version
    if isinstance(version, str):
        head = version.strip().split(".", 1)[0]
        return int(head) if head.isdigit() else None
    return None


def _arguments(impl: pluggy.HookImpl, **available: Any) -> dict[str, Any]:
    # pluggy lets an implementation accept fewer arguments than its spec declares.
    return {name: available[name] for name in impl.argnames if name in available}


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _redact(text: str, settings: Mapping[str, Any]) -> str:
    """Keep configured values (tokens, passwords) out of reports and logs."""
    values: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, Mapping):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif isinstance(value, str) and len(value) >= 4:
            values.append(value)

    walk(settings)
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, "***")
    return text


# ---- plugin folders -----------------------------------------------------------------------------

def resolve_plugin_dir(entry: str) -> tuple[Path, list[Path]]:
    """The folder a `[plugins] dirs` entry names, and every place looked at.

    Relative entries are relative to the working directory. In the frozen binary the default
    `./plugins` is also looked for next to the executable when the working directory has none."""
    raw = Path(entry).expanduser()
    path = raw if raw.is_absolute() else Path.cwd() / raw
    looked = [path]
    if getattr(sys, "frozen", False) and raw == DEFAULT_DIR and not path.is_dir():
        beside = Path(sys.executable).resolve().parent / DEFAULT_DIR
        looked.append(beside)
        if beside.is_dir():
            path = beside
    return path, looked


def plugin_candidates(folder: Path) -> list[tuple[str, Path]]:
    """(stem, file to import) for each `.py` file and package in `folder`, sorted by name.
    Names starting with `_` or `.`, other files and folders without __init__.py are ignored."""
    found: list[tuple[str, Path]] = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.startswith(("_", ".")):
            continue
        if entry.is_dir():
            if (entry / "__init__.py").is_file() and entry.name.isidentifier():
                found.append((entry.name, entry / "__init__.py"))
        elif entry.suffix == ".py" and entry.is_file() and entry.stem.isidentifier():
            found.append((entry.stem, entry))
    return found


def _import_file(stem: str, path: Path) -> types.ModuleType:
    if NAMESPACE not in sys.modules:
        namespace = types.ModuleType(NAMESPACE, "Plugins loaded from the plugin folders.")
        namespace.__path__ = []
        sys.modules[NAMESPACE] = namespace
    module_name = f"{NAMESPACE}.{stem}"
    for loaded in [m for m in sys.modules if m == module_name or m.startswith(module_name + ".")]:
        del sys.modules[loaded]  # a previous load (another folder, an earlier test) must not leak in
    is_package = path.name == "__init__.py"
    spec = importlib.util.spec_from_file_location(
        module_name, path, submodule_search_locations=[str(path.parent)] if is_package else None)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # so the plugin's own relative imports and dataclasses work
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def load_plugins(config: Config, *, builtin_modules: Sequence[str] = BUILTIN_MODULES) -> Registry:
    """Built-in modules first, then each plugin folder's plugins in name order."""
    registry = Registry(config.plugins.tables)
    strict = config.plugins.strict

    def record(report: PluginReport) -> None:
        registry.load_report.append(report)
        if report.error is None:
            return
        where = f"plugin {report.name} ({report.file})" if report.name else report.file
        if strict:  # the refusal says it; a warning first would say it twice
            raise PluginError(f"{where}: {report.error}")
        log.warning("%s not loaded: %s", where, report.error)

    for module_name in builtin_modules:
        name = module_name.rsplit(".", 1)[-1]
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            record(PluginReport(name, module_name, error=registry.describe_error(exc, name), builtin=True))
            continue
        record(registry.register(module, name, getattr(module, "__file__", None) or module_name, builtin=True))

    for entry in config.plugins.dirs:
        folder, looked = resolve_plugin_dir(entry)
        registry.dirs.append(folder)
        if not folder.is_dir():
            record(PluginReport(None, str(folder), error="plugin folder not found (looked in "
                                + ", ".join(str(p) for p in looked) + ")"))
            continue
        for stem, path in plugin_candidates(folder):
            shown = str(path.parent if path.name == "__init__.py" else path)
            if registry.pm.has_plugin(stem):
                record(PluginReport(stem, shown, error=f"a plugin named {stem!r} is already registered"))
                continue
            try:
                module = _import_file(stem, path)
            except BaseException as exc:  # SystemExit / KeyboardInterrupt at import are plugin bugs too
                if isinstance(exc, KeyboardInterrupt):
                    raise
                record(PluginReport(stem, shown, error=registry.describe_error(exc, stem)))
                continue
            record(registry.register(module, stem, shown))
    return registry
