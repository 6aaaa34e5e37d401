"""Plugins through the plugin folder and `appliance plugins`: good plugins load, broken ones (and
the junk beside them) are reported or ignored, never fatal unless strict; each plugin gets its own
settings table; the shipped example webhook and e-signature plugins work against a real local
HTTP server, and the example verifier checks leads at intake."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import http.server
import json
import shutil
import socket
import sys
import textwrap
import threading
import types
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest

from appliance import sdk
from appliance.config import Config, PluginsConfig, load_config
from appliance.runtime import create_runtime
from appliance.domain.campaign import Condition
from appliance.domain.endpoint import DeliveryEndpoint
from appliance.app import create_app
from appliance.plugins import BUILTIN_MODULES, PluginError, load_plugins
from litestar.testing import TestClient
from tests.buyer_server import BuyerServer, wait_until
from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.worker_helpers import lead_body

ROOT = Path(__file__).resolve().parent.parent


def write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def delivery_plugin(adapter_name: str, extra: str = "") -> str:
    return f"""
        from appliance.sdk import DeliveryAdapter, DeliveryResult, hookimpl

        class Adapter(DeliveryAdapter):
            name = {adapter_name!r}
            {extra}
            async def deliver(self, request, http):
                return DeliveryResult(outcome="success")

        @hookimpl
        def appliance_delivery_adapters(settings):
            return [Adapter()]
    """


GOOD_KINDS = """
    from appliance.sdk import PixelPlatform, PixelResult, SmsProvider, SmsResult, hookimpl

    class Sms(SmsProvider):
        name = "good_sms"
        async def send(self, message, http):
            return SmsResult(accepted=True)

    class Pixel(PixelPlatform):
        name = "good_pixel"
        async def fire(self, event, http):
            return PixelResult(success=True)

    @hookimpl
    def appliance_sms_providers(settings):
        return [Sms()]

    @hookimpl
    def appliance_pixel_platforms():  # an implementation may take fewer arguments than the spec
        return (Pixel(),)
"""

# plugin name -> (source, what its error must say)
BROKEN = {
    "bad_syntax": ("def oops(:\n", "SyntaxError"),
    "import_error": ("import appliance_no_such_module\n",
                     "ModuleNotFoundError: No module named 'appliance_no_such_module'"),
    "raises_on_import": ("raise RuntimeError('boom at import')\n", "RuntimeError: boom at import"),
    "old_api": (delivery_plugin("old", "api_version = 2"), "plugin API version 2"),
    "not_a_list": ("""
        from appliance.sdk import hookimpl
        @hookimpl
        def appliance_sms_providers(settings):
            return "twilio"
    """, "must return a list of adapters, not str"),
    "not_an_adapter": ("""
        from appliance.sdk import hookimpl
        @hookimpl
        def appliance_pixel_platforms(settings):
            return [object()]
    """, "returned object, not a PixelPlatform"),
    "hook_raises": ("""
        from appliance.sdk import hookimpl
        @hookimpl
        def appliance_delivery_adapters(settings):
            raise KeyError("api_key")
    """, "appliance_delivery_adapters raised KeyError"),
    "misspelt_hook": ("""
        from appliance.sdk import hookimpl
        @hookimpl
        def appliance_delivery_adapter(settings):
            return []
    """, "unknown hook 'appliance_delivery_adapter'"),
    "wrong_argument": ("""
        from appliance.sdk import hookimpl
        @hookimpl
        def appliance_delivery_adapters(config):
            return []
    """, "PluginValidationError"),
    "no_deliver": ("""
        from appliance.sdk import DeliveryAdapter, hookimpl
        class Lazy(DeliveryAdapter):
            name = "lazy"
        @hookimpl
        def appliance_delivery_adapters(settings):
            return [Lazy()]
    """, "does not implement deliver()"),
    # sorts after good.py, so "good" is taken by then; the whole plugin is skipped
    "with_duplicate_name": (delivery_plugin("good"), "delivery adapter name 'good' is already registered by plugin 'good'"),
}


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir()
    return folder


def plugin_adapters(report: dict, plugin_dir: Path) -> set[tuple[str, str, str]]:
    """The adapters that came from the test's plugin folder (built-ins left out)."""
    return {(a["kind"], a["name"], a["plugin"]) for a in report["adapters"]
            if a["file"].startswith(str(plugin_dir))}


def populate(plugin_dir: Path) -> None:
    write(plugin_dir, "good.py", delivery_plugin("good"))
    write(plugin_dir, "kinds.py", GOOD_KINDS)
    write(plugin_dir, "packaged/__init__.py", """
        from appliance.sdk import hookimpl
        from .adapter import Adapter as Packaged

        @hookimpl
        def appliance_delivery_adapters(settings):
            return [Packaged()]
    """)
    write(plugin_dir, "packaged/adapter.py", delivery_plugin("packaged"))
    for name, (source, _) in BROKEN.items():
        write(plugin_dir, f"{name}.py", source)
    # junk beside real plugins: never loaded, never reported
    write(plugin_dir, "README.txt", "not a plugin")
    write(plugin_dir, ".hidden.py", "def broken(:\n")
    write(plugin_dir, "_private.py", "raise RuntimeError('private modules are not plugins')\n")
    (plugin_dir / "stale.pyc").write_bytes(b"\x00\x01garbage")
    write(plugin_dir, "notes/helpers.py", "raise RuntimeError('a folder without __init__ is not a plugin')\n")
    write(plugin_dir, "__pycache__/good.cpython-312.pyc", "garbage")
    write(plugin_dir, "has-dash.py", "raise RuntimeError('not an importable name')\n")


def test_plugins_lists_good_adapters_and_reports_each_broken_plugin(cli, plugin_dir):
    populate(plugin_dir)
    report = cli.json("plugins")
    assert plugin_adapters(report, plugin_dir) == {
        ("delivery", "good", "good"), ("delivery", "packaged", "packaged"),
        ("sms", "good_sms", "kinds"), ("pixel", "good_pixel", "kinds")}
    by_name = {a["name"]: a for a in report["adapters"]}
    assert by_name["good"]["file"] == str(plugin_dir / "good.py")
    assert by_name["packaged"]["file"] == str(plugin_dir / "packaged")

    errors = {e["plugin"]: e for e in report["errors"]}
    assert set(errors) == set(BROKEN)
    for name, (_, expected) in BROKEN.items():
        assert expected in errors[name]["error"], (name, errors[name])
        assert errors[name]["file"] == str(plugin_dir / f"{name}.py")
        assert "\n" not in errors[name]["error"]
    assert report["dirs"] == [str(plugin_dir)]

    assert ("compliance", "trustedform") in {(a["kind"], a["name"]) for a in report["adapters"]}  # built in

    text = cli("plugins").stdout
    assert "good_sms" in text and "error" in text and "bad_syntax" in text and "trustedform" in text


def test_plugins_lists_every_plugin_with_its_adapters_and_hooks(cli, config_file, plugin_dir):
    for shipped in ("example_esign.py", "example_lead_events.py", "example_webhook.py"):
        shutil.copy(ROOT / "plugins" / shipped, plugin_dir)
    with config_file.open("a") as f:  # example_esign does not load without its settings
        f.write('\n[plugins.example_esign]\nbase_url = "http://127.0.0.1:9"\napi_key = "k"\n'
                'webhook_secret = "s"\n')
    write(plugin_dir, "idle.py", """
        from appliance.sdk import hookimpl

        @hookimpl
        def appliance_delivery_adapters():
            return []
    """)
    report = cli.json("plugins")
    assert [p for p in report["plugins"] if not p["builtin"]] == [
        {"plugin": "example_esign", "file": str(plugin_dir / "example_esign.py"), "builtin": False,
         "adapters": [{"kind": "esign", "name": "example_esign"}], "hooks": ["appliance_esign_adapters"]},
        {"plugin": "example_lead_events", "file": str(plugin_dir / "example_lead_events.py"), "builtin": False,
         "adapters": [], "hooks": ["on_lead_event"]},
        {"plugin": "example_webhook", "file": str(plugin_dir / "example_webhook.py"), "builtin": False,
         "adapters": [{"kind": "delivery", "name": "example_webhook"}], "hooks": ["appliance_delivery_adapters"]},
        {"plugin": "idle", "file": str(plugin_dir / "idle.py"), "builtin": False,
         "adapters": [], "hooks": ["appliance_delivery_adapters"]}]
    assert {p["plugin"] for p in report["plugins"] if p["builtin"]} == {
        *(m.rsplit(".", 1)[-1] for m in BUILTIN_MODULES), "trustedform"}
    assert report["errors"] == []
    # `adapters` keeps its shape (.ci/smoke-binary reads it): every plugin's adapters, with plugin and file
    assert report["adapters"] == [{**a, "plugin": p["plugin"], "file": p["file"]}
                                  for p in report["plugins"] for a in p["adapters"]]

    text = cli("plugins").stdout.splitlines()
    assert f"esign     example_esign        example_esign  {plugin_dir / 'example_esign.py'}" in text
    assert f"hook      on_lead_event        example_lead_events  {plugin_dir / 'example_lead_events.py'}" in text
    assert f"delivery  example_webhook      example_webhook  {plugin_dir / 'example_webhook.py'}" in text
    assert f"-         provides nothing     idle  {plugin_dir / 'idle.py'}" in text


def test_strict_makes_a_broken_plugin_fatal(cli, config_file, plugin_dir):
    write(plugin_dir, "good.py", delivery_plugin("good"))
    with config_file.open("a") as f:
        f.write("strict = true\n")  # the [plugins] table is the file's last
    assert plugin_adapters(cli.json("plugins"), plugin_dir) == {("delivery", "good", "good")}

    write(plugin_dir, "import_error.py", BROKEN["import_error"][0])
    result = cli("plugins", "--json", expect=1)
    assert result.stdout == ""
    assert result.stderr.strip() == (f"error: plugin import_error ({plugin_dir / 'import_error.py'}): "
                                      "ModuleNotFoundError: No module named 'appliance_no_such_module'")
    with pytest.raises(PluginError, match="import_error"):
        load_plugins(load_config(config_file))


def test_missing_plugin_folder_is_reported_not_fatal_unless_strict(cli, config_file, tmp_path):
    report = cli.json("plugins")  # the fixture's folder was never created
    assert report["errors"] == [{"plugin": None, "file": str(tmp_path / "plugins"),
                                 "error": f"plugin folder not found (looked in {tmp_path / 'plugins'})"}]
    with config_file.open("a") as f:
        f.write("strict = true\n")
    assert "plugin folder not found" in cli("plugins", expect=1).stderr


def test_each_plugin_gets_its_own_settings_table(cli, config_file, plugin_dir):
    named = """
        from appliance.sdk import DeliveryAdapter, DeliveryResult, hookimpl

        class Named(DeliveryAdapter):
            def __init__(self, name):
                self.name = name
            async def deliver(self, request, http):
                return DeliveryResult(outcome="success")

        @hookimpl
        def appliance_delivery_adapters(settings):
            return [Named(settings.get("adapter_name", "unset"))]
    """
    write(plugin_dir, "named.py", named)
    write(plugin_dir, "other.py", named)
    write(plugin_dir, "untabled.py", named)
    write(plugin_dir, "leaky.py", """
        from appliance.sdk import hookimpl
        @hookimpl
        def appliance_sms_providers(settings):
            raise ValueError(f"token {settings['token']} was refused")
    """)
    with config_file.open("a") as f:
        f.write('\n[plugins.named]\nadapter_name = "from_named_settings"\n'
                '\n[plugins.other]\nadapter_name = "from_other_settings"\n'
                '\n[plugins.leaky]\ntoken = "s3cr3t-token-value"\n')
    report = cli.json("plugins")
    assert plugin_adapters(report, plugin_dir) == {
        ("delivery", "from_named_settings", "named"), ("delivery", "from_other_settings", "other"),
        ("delivery", "unset", "untabled")}
    (leak,) = report["errors"]
    assert leak["plugin"] == "leaky"
    assert leak["error"] == "appliance_sms_providers raised ValueError: token *** was refused"
    assert "s3cr3t" not in json.dumps(report)

    registry = load_plugins(load_config(config_file))
    assert registry.adapter_settings("delivery", "from_other_settings") == {"adapter_name": "from_other_settings"}
    assert registry.adapter_settings("delivery", "unset") == {} == registry.adapter_settings("sms", "nope")


def test_builtin_modules_register_first_like_plugins(monkeypatch, plugin_dir):
    builtin = types.ModuleType("fake_builtin_adapters")
    exec(textwrap.dedent(delivery_plugin("http_like")), builtin.__dict__)
    monkeypatch.setitem(sys.modules, "fake_builtin_adapters", builtin)
    write(plugin_dir, "clash.py", delivery_plugin("http_like"))
    config = Config(plugins=PluginsConfig(dirs=[str(plugin_dir)]))

    registry = load_plugins(config, builtin_modules=("fake_builtin_adapters",))
    assert [(e.kind, e.name, e.plugin) for e in registry.entries] == [("delivery", "http_like", "fake_builtin_adapters")]
    assert type(registry.delivery_adapter("http_like")) is builtin.Adapter
    (clash,) = registry.errors
    assert (clash.name, clash.error) == ("clash", "delivery adapter name 'http_like' is already registered by plugin 'fake_builtin_adapters'")
    assert registry.delivery_adapter("nope") is None and registry.sms_provider("nope") is None
    assert registry.pixel_platform("nope") is None

    # the real built-ins load cleanly, the same way
    default = load_plugins(Config(plugins=PluginsConfig(dirs=[])))
    assert default.errors == []
    assert [r.name for r in default.load_report] == [m.rsplit(".", 1)[-1] for m in BUILTIN_MODULES]
    assert default.delivery_adapter("http") is not None


def test_frozen_binary_finds_plugins_next_to_itself(monkeypatch, tmp_path):
    exe_dir, cwd = tmp_path / "dist", tmp_path / "cwd"
    write(exe_dir / "plugins", "beside.py", delivery_plugin("beside"))
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(exe_dir / "appliance"))
    config = Config(plugins=PluginsConfig(dirs=["./plugins"]))

    registry = load_plugins(config, builtin_modules=())
    assert registry.dirs == [exe_dir / "plugins"] and registry.errors == []
    assert registry.delivery_adapter("beside") is not None

    write(cwd / "plugins", "here.py", delivery_plugin("here"))  # the working directory's folder wins
    registry = load_plugins(config, builtin_modules=())
    assert registry.dirs == [cwd / "plugins"] and sorted(registry.delivery_adapters) == ["here"]

    monkeypatch.setattr(sys, "frozen", False)
    shutil.rmtree(cwd / "plugins")
    (missing,) = load_plugins(config, builtin_modules=()).errors
    assert missing.error == f"plugin folder not found (looked in {cwd / 'plugins'})"


# ---- one test per hook (test_every_hook_has_a_test checks the names against sdk.HookSpecs) --------

def test_hook_appliance_delivery_adapters(plugin_dir):
    write(plugin_dir, "deliverer.py", delivery_plugin("deliverer"))
    registry = load_plugins(Config(plugins=PluginsConfig(dirs=[str(plugin_dir)])), builtin_modules=())
    assert registry.delivery_adapter("deliverer").name == "deliverer"
    assert registry.delivery_adapter("nobody") is None


def test_hook_appliance_sms_providers(plugin_dir):
    write(plugin_dir, "kinds.py", GOOD_KINDS)
    registry = load_plugins(Config(plugins=PluginsConfig(dirs=[str(plugin_dir)])), builtin_modules=())
    assert [(e.kind, e.name) for e in registry.entries if e.kind == "sms"] == [("sms", "good_sms")]


def test_hook_appliance_pixel_platforms(plugin_dir):
    write(plugin_dir, "kinds.py", GOOD_KINDS)
    registry = load_plugins(Config(plugins=PluginsConfig(dirs=[str(plugin_dir)])), builtin_modules=())
    assert [(e.kind, e.name) for e in registry.entries if e.kind == "pixel"] == [("pixel", "good_pixel")]


def test_hook_appliance_esign_adapters(plugin_dir):
    write(plugin_dir, "signer.py", """
        from appliance.sdk import EsignAdapter, EsignSent, hookimpl

        class Signer(EsignAdapter):
            name = "signer"
            async def send(self, request, http):
                return EsignSent(outcome="sent", provider_document_id=request.external_id)

        @hookimpl
        def appliance_esign_adapters(settings):
            return [Signer()]
    """)
    write(plugin_dir, "unsent.py", """
        from appliance.sdk import EsignAdapter, hookimpl

        class Unsent(EsignAdapter):
            name = "unsent"

        @hookimpl
        def appliance_esign_adapters(settings):
            return [Unsent()]
    """)
    write(plugin_dir, "next_major.py", """
        from appliance.sdk import EsignAdapter, EsignSent, hookimpl

        class NextMajor(EsignAdapter):
            name = "next_major"
            api_version = 2
            async def send(self, request, http):
                return EsignSent(outcome="sent")

        @hookimpl
        def appliance_esign_adapters(settings):
            return [NextMajor()]
    """)
    write(plugin_dir, "wrong_kind.py", """
        from appliance.sdk import DeliveryAdapter, DeliveryResult, hookimpl

        class Deliverer(DeliveryAdapter):
            name = "deliverer"
            async def deliver(self, request, http):
                return DeliveryResult(outcome="success")

        @hookimpl
        def appliance_esign_adapters(settings):
            return [Deliverer()]
    """)
    registry = load_plugins(Config(plugins=PluginsConfig(dirs=[str(plugin_dir)])), builtin_modules=())
    assert [(e.kind, e.name, e.plugin) for e in registry.entries] == [("esign", "signer", "signer")]
    signer = registry.esign_adapter("signer")
    assert signer is registry.esign_adapters["signer"] and signer.api_version == sdk.API_VERSION
    assert registry.esign_adapter("nobody") is None and registry.delivery_adapter("signer") is None
    assert {r.name: r.error for r in registry.errors} == {
        "unsent": "esign adapter 'unsent' does not implement send()",
        "next_major": ("esign adapter 'next_major' is built for plugin API version 2; "
                       "this appliance speaks version 1"),
        "wrong_kind": "appliance_esign_adapters returned Deliverer, not a EsignAdapter"}

    request = sdk.EsignRequest(template_id="T1", title="Agreement", external_id="lead_1/agreement",
                               recipient_email="pat@example.com", recipient_name=None, fields={}, settings={})
    assert asyncio.run(signer.send(request, None)).provider_document_id == "lead_1/agreement"
    # What the adapter leaves to the base class: no callback is trusted, no file can be fetched.
    assert signer.verify_callback({}, b"{}", {}) is False and signer.read_callback(b"{}") is None
    assert asyncio.run(signer.fetch_signed("D1", {}, None)).outcome == "failed"


def test_hook_appliance_verifiers(plugin_dir):
    write(plugin_dir, "checker.py", """
        from appliance.sdk import VerificationResult, Verifier, hookimpl

        class Checker(Verifier):
            name = "checker"
            async def verify(self, request, http):
                return VerificationResult(outcome="pass", data={"seen": request.lead["email"]})

        @hookimpl
        def appliance_verifiers(settings):
            return [Checker()]
    """)
    write(plugin_dir, "unchecked.py", """
        from appliance.sdk import Verifier, hookimpl

        class Unchecked(Verifier):
            name = "unchecked"

        @hookimpl
        def appliance_verifiers(settings):
            return [Unchecked()]
    """)
    write(plugin_dir, "next_major.py", """
        from appliance.sdk import VerificationResult, Verifier, hookimpl

        class NextMajor(Verifier):
            name = "next_major"
            api_version = "2.0"
            def verify(self, request, http):
                return VerificationResult(outcome="pass")

        @hookimpl
        def appliance_verifiers(settings):
            return [NextMajor()]
    """)
    write(plugin_dir, "wrong_kind.py", """
        from appliance.sdk import PixelPlatform, PixelResult, hookimpl

        class Pixel(PixelPlatform):
            name = "pixel"
            async def fire(self, event, http):
                return PixelResult(success=True)

        @hookimpl
        def appliance_verifiers(settings):
            return [Pixel()]
    """)
    registry = load_plugins(Config(plugins=PluginsConfig(dirs=[str(plugin_dir)])), builtin_modules=())
    assert [(e.kind, e.name, e.plugin) for e in registry.entries] == [("verifier", "checker", "checker")]
    checker = registry.verifier("checker")
    assert checker is registry.verifiers["checker"] and checker.api_version == sdk.API_VERSION
    assert registry.verifier("nobody") is None and registry.esign_adapter("checker") is None
    assert {r.name: r.error for r in registry.errors} == {
        "unchecked": "verifier adapter 'unchecked' does not implement verify()",
        "next_major": ("verifier adapter 'next_major' is built for plugin API version '2.0'; "
                       "this appliance speaks version 1"),
        "wrong_kind": "appliance_verifiers returned Pixel, not a Verifier"}

    request = sdk.VerificationRequest(lead={"email": "pat@example.com"}, config={}, settings={}, timeout_seconds=2)
    assert asyncio.run(checker.verify(request, None)) == sdk.VerificationResult(outcome="pass",
                                                                               data={"seen": "pat@example.com"})
    # What the verifier leaves to the base class: any config goes, nothing is cached, it may block.
    assert checker.validate({"anything": 1}) == [] and checker.cache_key(request) is None
    assert checker.blocking is True


ACTION = sdk.IntakeAction(action="engage", lead={"email": "a@example.com"}, campaign_id="C1",
                          submission_id="S1", config={"channel": "sms"})


def test_hook_appliance_intake_action(plugin_dir):
    write(plugin_dir, "actions.py", """
        from appliance.sdk import hookimpl
        SEEN = []

        @hookimpl
        def appliance_intake_action(action):
            SEEN.append((action.action, action.submission_id, action.config))
    """)
    write(plugin_dir, "broken_action.py", """
        from appliance.sdk import hookimpl

        @hookimpl
        def appliance_intake_action(action):
            raise RuntimeError("crm down")
    """)
    registry = load_plugins(Config(plugins=PluginsConfig(dirs=[str(plugin_dir)])), builtin_modules=())
    assert registry.call_intake_action(ACTION) == ["broken_action: RuntimeError: crm down"]
    assert registry.pm.get_plugin("actions").SEEN == [("engage", "S1", {"channel": "sms"})]
    empty = load_plugins(Config(plugins=PluginsConfig(dirs=[])), builtin_modules=())
    assert empty.call_intake_action(ACTION) == []


def test_hook_appliance_evaluate_prompt(plugin_dir):
    write(plugin_dir, "prompts.py", """
        from appliance.sdk import hookimpl

        @hookimpl
        def appliance_evaluate_prompt(prompt, facts):
            if prompt == "explode":
                raise RuntimeError("model unavailable")
            if prompt == "is the lead a homeowner?":
                return facts.get("homeowner")
            return None
    """)
    evaluate = load_plugins(Config(plugins=PluginsConfig(dirs=[str(plugin_dir)])), builtin_modules=()).prompt_evaluator()
    assert evaluate(Condition(prompt="is the lead a homeowner?"), {"homeowner": True}) is True
    assert evaluate(Condition(prompt="is the lead a homeowner?"), {"homeowner": 0}) is False
    assert evaluate(Condition(prompt="something else"), {}) is None
    assert evaluate(Condition(prompt="explode"), {}) is None
    assert load_plugins(Config(plugins=PluginsConfig(dirs=[])), builtin_modules=()).prompt_evaluator() is None


# ---- the shipped example plugin -----------------------------------------------------------------

class _Buyer(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.received.append((self.path, dict(self.headers), body))
        status = int(self.path.rsplit("/", 1)[-1])
        payload = json.dumps({"id": "buyer-1"} if status < 300 else {"error": "no"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def buyer() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Buyer)
    _Buyer.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, *, allow_private: bool = True) -> sdk.DeliveryRequest:
    return sdk.DeliveryRequest(
        lead={"email": "pat@example.com", "firstName": "Pat"}, submission_id="sub-123", attempt=1,
        endpoint=DeliveryEndpoint(delivery_endpoint_id="E1", adapter="example_webhook", url=url,
                                  headers={"X-Endpoint": "e1"}, timeout_seconds=2),
        secrets={}, settings={}, allow_private_addresses=allow_private)


def test_example_webhook_plugin_loads_and_delivers(cli, config_file, plugin_dir, buyer):
    shutil.copy(ROOT / "plugins" / "example_webhook.py", plugin_dir)
    with config_file.open("a") as f:
        f.write('\n[plugins.example_webhook]\nheaders = { X-Static = "yes" }\n')
    report = cli.json("plugins")
    assert plugin_adapters(report, plugin_dir) == {("delivery", "example_webhook", "example_webhook")}
    assert report["errors"] == []

    adapter = load_plugins(load_config(config_file)).delivery_adapter("example_webhook")
    assert adapter is not None and adapter.api_version == sdk.API_VERSION

    async def deliver_all() -> dict[str, sdk.DeliveryResult]:
        async with httpx.AsyncClient() as http:
            cases = {str(code): _request(f"{buyer}/status/{code}") for code in (200, 400, 409, 500)}
            cases["refused"] = _request(f"http://127.0.0.1:{_closed_port()}/status/200")
            cases["private"] = _request(f"{buyer}/status/200", allow_private=False)
            return {name: await adapter.deliver(req, http) for name, req in cases.items()}

    results = asyncio.run(deliver_all())
    assert {name: r.outcome for name, r in results.items()} == {
        "200": "success", "400": "failure", "409": "duplicate", "500": "error",
        "refused": "error", "private": "failure"}
    assert results["200"].client_lead_id == "buyer-1" and results["200"].status_code == 200
    assert results["500"].reason == "HTTP 500" and results["refused"].reason.startswith("connection failed")
    assert results["private"].reason == "private address refused"

    assert [path for path, _, _ in _Buyer.received] == ["/status/200", "/status/400", "/status/409", "/status/500"]
    _, headers, body = _Buyer.received[0]
    assert headers["Idempotency-Key"] == "sub-123"
    assert headers["X-Static"] == "yes" and headers["X-Endpoint"] == "e1"
    assert msgspec.json.decode(body) == {"email": "pat@example.com", "firstName": "Pat"}


def test_example_webhook_refuses_unknown_settings(cli, config_file, plugin_dir):
    shutil.copy(ROOT / "plugins" / "example_webhook.py", plugin_dir)
    with config_file.open("a") as f:
        f.write('\n[plugins.example_webhook]\nurll = "https://typo.example"\n')
    (error,) = cli.json("plugins")["errors"]
    assert error["plugin"] == "example_webhook"
    assert error["error"] == ("appliance_delivery_adapters raised ValidationError: "
                              "Object contains unknown field `urll`")


ESIGN_SECRET = "esign-webhook-secret"


def test_example_esign_plugin_sends_verifies_reads_and_fetches():
    with BuyerServer() as provider:
        settings = {"base_url": provider.url("/v1"), "api_key": "esign-api-key", "webhook_secret": ESIGN_SECRET,
                    "timeout_seconds": 5}
        config = Config(plugins=PluginsConfig(dirs=[str(ROOT / "plugins")], tables={"example_esign": settings}))
        registry = load_plugins(config, builtin_modules=())
        assert registry.errors == []
        assert [(e.kind, e.plugin) for e in registry.entries if e.name == "example_esign"] == [
            ("esign", "example_esign")]
        adapter = registry.esign_adapter("example_esign")
        assert adapter is not None and adapter.api_version == sdk.API_VERSION

        def request(*, allow_private: bool = True) -> sdk.EsignRequest:
            return sdk.EsignRequest(
                template_id="tpl-9", title="Retainer", external_id="lead_1/retainer",
                recipient_email="pat@example.com", recipient_name="Pat Doe", fields={"client_name": "Pat Doe"},
                settings=settings, timeout_seconds=2, allow_private_addresses=allow_private)  # the provider is local

        async def send(**reply) -> sdk.EsignSent:
            provider.route("/v1/documents", **reply)
            async with httpx.AsyncClient() as http:
                return await adapter.send(request(), http)

        async def fetch(document_id: str) -> sdk.EsignFetched:
            async with httpx.AsyncClient() as http:
                return await adapter.fetch_signed(document_id, settings, http, timeout_seconds=2,
                                                  allow_private_addresses=True)

        sent = asyncio.run(send(status=201, body={"id": "doc-1", "signingUrl": "https://sign.example/doc-1"}))
        assert sent == sdk.EsignSent(outcome="sent", provider_document_id="doc-1",
                                     signing_url="https://sign.example/doc-1")
        (posted,) = provider.requests
        assert (posted.method, posted.path) == ("POST", "/v1/documents")
        assert posted.headers["authorization"] == "Bearer esign-api-key"
        assert posted.headers["idempotency-key"] == "lead_1/retainer"
        assert posted.json() == {"templateId": "tpl-9", "title": "Retainer", "externalId": "lead_1/retainer",
                                 "recipient": {"email": "pat@example.com", "name": "Pat Doe"},
                                 "fields": {"client_name": "Pat Doe"}}

        assert asyncio.run(send(status=503)) == sdk.EsignSent(outcome="retry", reason="HTTP 503")
        assert asyncio.run(send(status=422, body={"error": "unknown template"})) == sdk.EsignSent(
            outcome="failed", reason="HTTP 422")
        assert asyncio.run(send(status=200, body={"ok": True})) == sdk.EsignSent(
            outcome="failed", reason="HTTP 200 without a document id")
        sends = len(provider.requests)

        async def send_to_private() -> sdk.EsignSent:
            async with httpx.AsyncClient() as http:
                return await adapter.send(request(allow_private=False), http)

        assert asyncio.run(send_to_private()) == sdk.EsignSent(outcome="failed", reason="private address refused")
        assert len(provider.requests) == sends  # refused before any connection

        callback = json.dumps({"event": "document.completed", "documentId": "doc-1"}).encode()
        signature = hmac.new(ESIGN_SECRET.encode(), callback, hashlib.sha256).hexdigest()
        forged = hmac.new(b"another secret", callback, hashlib.sha256).hexdigest()
        assert adapter.verify_callback({"x-example-signature": signature}, callback, settings) is True
        assert adapter.verify_callback({"x-example-signature": forged}, callback, settings) is False
        assert adapter.verify_callback({"x-example-signature": signature}, callback + b" ", settings) is False
        assert adapter.verify_callback({}, callback, settings) is False
        assert adapter.verify_callback({"x-example-signature": "é"}, callback, settings) is False

        assert adapter.read_callback(callback) == sdk.EsignCallback(provider_document_id="doc-1", status="signed")
        assert adapter.read_callback(b'{"event": "document.rejected", "documentId": "doc-1", "reason": "no"}') == \
            sdk.EsignCallback(provider_document_id="doc-1", status="declined", reason="no")
        assert adapter.read_callback(b'{"event": "document.reminded", "documentId": "doc-1"}').status is None
        assert adapter.read_callback(b'{"event": "document.completed"}') is None
        assert adapter.read_callback(b"not json") is None

        provider.route("/v1/documents/doc-1/file", status=200, body=b"%PDF-1.7 signed",
                       headers={"Content-Type": "application/pdf"})
        assert asyncio.run(fetch("doc-1")) == sdk.EsignFetched(outcome="fetched", content=b"%PDF-1.7 signed")
        # A document id from a callback stays one path segment; unknown here, so the provider answers 404.
        assert asyncio.run(fetch("doc-1/../../admin")) == sdk.EsignFetched(outcome="failed", reason="HTTP 404")
        assert provider.requests[-1].path == "/v1/documents/doc-1%2F..%2F..%2Fadmin/file"


def test_example_esign_refuses_missing_and_unknown_settings(plugin_dir):
    shutil.copy(ROOT / "plugins" / "example_esign.py", plugin_dir)
    for table, expected in [
        ({"base_url": "https://esign.example", "api_key": "k"},
         "Object missing required field `webhook_secret`"),
        ({"base_url": "https://esign.example", "api_key": "k", "webhook_secret": ""},
         "Expected `str` of length >= 1 - at `$.webhook_secret`"),
        ({"base_url": "https://esign.example", "api_key": "k", "webhook_secret": "s", "webhook_secrett": "s"},
         "Object contains unknown field `webhook_secrett`")]:
        config = Config(plugins=PluginsConfig(dirs=[str(plugin_dir)], tables={"example_esign": table}))
        (error,) = load_plugins(config, builtin_modules=()).errors
        assert error.error == f"appliance_esign_adapters raised ValidationError: {expected}"
    # Without a table (the repository's own plugins folder, say) it loads and offers nothing.
    registry = load_plugins(Config(plugins=PluginsConfig(dirs=[str(plugin_dir)])), builtin_modules=())
    assert registry.errors == [] and registry.esign_adapter("example_esign") is None


def test_example_verifier_plugin_checks_leads_against_its_list(cli, config_file, plugin_dir, tmp_path):
    shutil.copy(ROOT / "plugins" / "example_verifier.py", plugin_dir)
    listed = tmp_path / "do-not-contact.txt"
    listed.write_text("# complaints\n+14155550100\nStop@Example.com  # asked twice\n")
    with config_file.open("a") as f:
        f.write(f'\n[plugins.example_verifier]\nlist_file = "{listed}"\n')
    report = cli.json("plugins")
    assert plugin_adapters(report, plugin_dir) == {("verifier", "example_verifier", "example_verifier")}
    assert report["errors"] == []
    assert f"verifier  example_verifier     example_verifier  {plugin_dir / 'example_verifier.py'}" in \
        cli("plugins").stdout.splitlines()

    tenant_id = cli.json("tenant", "create", "Acme")["tenantId"]
    bundle = tmp_path / "bundle.json"

    def import_steps(*steps: dict, expect: int = 0):
        bundle.write_text(json.dumps({"campaigns": [campaign("DNC", "Checked", qualification={
            "verifications": list(steps)})]}))
        return cli("import", "--tenant", tenant_id, str(bundle), expect=expect)

    refused = import_steps({"verifier": "example_verifier", "config": {"fields": ["fax"], "list": "x"}},
                           expect=1).stderr
    assert "campaigns[0].qualification.verifications[0].config.list: unknown field" in refused
    assert "campaigns[0].qualification.verifications[0].config.fields[0]: must be phoneE164 or email" in refused
    import_steps({"verifier": "example_verifier"})
    key = cli.json("key", "create", "--tenant", tenant_id)["key"]

    runtime = create_runtime(load_config(config_file))
    try:
        with TestClient(create_app(runtime, background=False), raise_server_exceptions=False) as client:
            def submit(email: str, phone: str) -> dict:
                body = {"campaignId": "DNC", "firstName": "Pat", "lastName": "Lee", "email": email, "phone": phone}
                answer = client.post("/api/v1/leads/submit", json=body, headers={"X-API-Key": key})
                assert answer.status_code == 201, answer.text
                return client.get(f"/api/v1/leads/{answer.json()['data']['leadId']}",
                                  headers={"X-API-Key": key}).json()["data"]

            on_phone = submit("pat@example.com", "+1 (415) 555-0100")
            on_email = submit("stop@example.com", "+14155550101")
            clean = submit("fine@example.com", "+14155550102")
    finally:
        runtime.close()
    assert (on_phone["status"], on_phone["submissions"][0]["result"]) == (
        "disqualified", "verification example_verifier failed: on the do-not-contact list")
    assert on_email["status"] == "disqualified"
    assert clean["status"] == "qualified"
    assert clean["verification"] == {"example_verifier": {"outcome": "pass", "reason": None,
                                                          "data": {"listed": False, "checked": 2}}}


def test_hook_on_lead_event(runtime, plugin_dir, caplog):
    write(plugin_dir, "listener.py", """
        from appliance.sdk import hookimpl
        SEEN = []

        @hookimpl
        def on_lead_event(tenant_id, event):
            SEEN.append((tenant_id, event["type"], event["data"]["leadId"], event["data"]["status"]))
    """)
    write(plugin_dir, "grumpy.py", """
        from appliance.sdk import hookimpl

        @hookimpl
        def on_lead_event(event):
            raise RuntimeError("crm down")
    """)
    tenant = make_tenant(runtime, "T", {"campaigns": [campaign("PL1", "Plugins")]})
    app = create_app(runtime)
    app.state.webhook_sender.poll_seconds = 0.05
    with TestClient(app, raise_server_exceptions=False) as client:
        lead = client.post("/api/v1/leads/submit", json=lead_body("PL1"), headers=tenant.headers)
        assert lead.status_code == 201 and lead.json()["data"]["status"] == "qualified"
        lead_id = lead.json()["data"]["leadId"]
        seen = app.state.registry.pm.get_plugin("listener").SEEN
        assert wait_until(lambda: len(seen) == 3, 10), seen  # the campaign has no buyer: the lead fails
        bulk = {"leadIds": [lead_id], "updates": {"status": "disqualified"}}
        assert client.patch("/api/v1/leads/bulk", json=bulk, headers=tenant.headers).status_code == 200
        assert wait_until(lambda: len(seen) == 4, 10), seen
    assert seen == [(tenant.tenant_id, "lead.processed", lead_id, "qualified"),
                    (tenant.tenant_id, "lead.qualified", lead_id, "qualified"),
                    (tenant.tenant_id, "lead.failed", lead_id, "failed"),
                    (tenant.tenant_id, "lead.disqualified", lead_id, "disqualified")]
    failures = [r for r in caplog.records if "on_lead_event" in r.getMessage()]
    assert len(failures) == 4 and "RuntimeError: crm down" in failures[0].getMessage()
    assert "Traceback" in failures[0].getMessage()


def test_example_lead_events_plugin_writes_each_event(runtime, plugin_dir, tmp_path, monkeypatch):
    shutil.copy(ROOT / "plugins" / "example_lead_events.py", plugin_dir)
    monkeypatch.setenv("APPLIANCE_LEAD_EVENTS_FILE", str(tmp_path / "events.jsonl"))
    tenant = make_tenant(runtime, "T", {"campaigns": [campaign("PL1", "Plugins")]})
    app = create_app(runtime)
    app.state.webhook_sender.poll_seconds = 0.05
    with TestClient(app, raise_server_exceptions=False) as client:
        lead_id = client.post("/api/v1/leads/submit", json=lead_body("PL1"), headers=tenant.headers).json()["data"]["leadId"]
        written = tmp_path / "events.jsonl"
        assert wait_until(lambda: written.exists() and len(written.read_text().splitlines()) == 3, 10)
    lines = [json.loads(line) for line in written.read_text().splitlines()]
    assert [(x["type"], x["leadId"], x["tenantId"]) for x in lines] == [
        ("lead.processed", lead_id, tenant.tenant_id), ("lead.qualified", lead_id, tenant.tenant_id),
        ("lead.failed", lead_id, tenant.tenant_id)]


HOOKS = [name for name in vars(sdk.HookSpecs) if not name.startswith("_")]


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_test(hook):
    # datasette's way: the hook specs themselves say which tests must exist, so a hook added to
    # sdk.HookSpecs without a test_hook_<name> here fails the suite.
    assert callable(globals().get(f"test_hook_{hook}")), f"no test_hook_{hook} in {__name__}"


def test_the_hook_list_is_read_from_the_specs():
    assert set(HOOKS) == {name for name in dir(load_plugins(Config(plugins=PluginsConfig(dirs=[])),
                                                             builtin_modules=()).pm.hook) if not name.startswith("_")}
