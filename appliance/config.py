"""The TOML configuration: one struct per table, unknown keys refused, every key defaulted.

`config.example.toml` documents each key; keep the two in step."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

from urllib.parse import urlsplit

import msgspec

from appliance.domain.messaging import check_ed25519_public_key
from appliance.model import Settings, describe_validation_error, invalid

CONFIG_ENV = "APPLIANCE_CONFIG"
DATABASE_URL_ENV = "APPLIANCE_DATABASE_URL"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def _check_base_url(field: str, url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        invalid(field, "must be an http or https URL")


class ServerConfig(Settings):
    host: str = "127.0.0.1"
    port: int = 8080
    log_level: str = "info"
    # A connection's request line and headers must be complete this long after it opened (after
    # the request's first byte, for the next request on a kept-alive connection).
    header_timeout_seconds: float = 10.0
    # Connections still sending a request's headers; one more closes the one waiting longest.
    max_incomplete_requests: int = 256
    # The console's session cookie is Secure on every answer (a TLS proxy in front that does not
    # send X-Forwarded-Proto); without it, only when the request came over TLS.
    secure_cookies: bool = False
    # PEM files: both set, the server answers HTTPS only (SIGHUP loads them again, appliance/tls.py).
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # The address people and providers reach the server at (a proxy's, say), for the links it
    # hands out (users' setup links); empty: this server's own scheme, host and port.
    public_url: str = ""

    def __post_init__(self) -> None:
        if self.public_url and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", self.public_url):
            invalid("public_url", "must be an http(s) URL without a query, e.g. https://leads.example.com")
        if not 1 <= self.port <= 65535:
            invalid("port", "must be a port number from 1 to 65535")
        if self.log_level not in LOG_LEVELS:
            invalid("log_level", f"must be one of {', '.join(LOG_LEVELS)}")
        if not 0 < self.header_timeout_seconds <= 3600:
            invalid("header_timeout_seconds", "must be more than 0 and at most 3600")
        if self.max_incomplete_requests < 1:
            invalid("max_incomplete_requests", "must be 1 or more")
        if self.tls_cert_file and not self.tls_key_file:
            invalid("tls_key_file", "is needed with tls_cert_file (both PEM files, or neither)")
        if self.tls_key_file and not self.tls_cert_file:
            invalid("tls_cert_file", "is needed with tls_key_file (both PEM files, or neither)")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert_file)


class LoggingConfig(Settings):
    format: str = "text"  # "text" lines for a person, "json" lines for a log collector
    level: str = ""  # empty: [server] log_level (where the level was set before [logging])

    def __post_init__(self) -> None:
        if self.format not in ("text", "json"):
            invalid("format", "must be text or json")
        if self.level and self.level not in LOG_LEVELS:
            invalid("level", f"must be one of {', '.join(LOG_LEVELS)}")


class StorageConfig(Settings):
    path: str = "./data"  # folder holding appliance.db, or with PostgreSQL the master key and logs
    synchronous: str = "FULL"
    activity_log_days: int = 90  # request log and webhook attempt rows older than this are purged; 0 keeps all
    backend: str = "sqlite"  # or "postgresql" (docs/postgresql.md)
    url: str = ""  # postgresql://user@host:port/db; APPLIANCE_DATABASE_URL, when set, is used instead
    # PostgreSQL: how long a process's claim on a running job lasts unless renewed (a quarter of it
    # apart); a dead process's jobs are taken over after about 1.25 times this. Shorter takes over
    # sooner but a process cut off from the database longer than this loses its jobs (a repeat).
    job_lease_seconds: float = 60.0

    def __post_init__(self) -> None:
        if self.synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            invalid("synchronous", "must be FULL, NORMAL or EXTRA")
        if self.activity_log_days < 0:
            invalid("activity_log_days", "must be 0 (keep all) or more")
        if self.backend not in ("sqlite", "postgresql"):
            invalid("backend", "must be sqlite or postgresql")
        if self.url and urlsplit(self.url).scheme not in ("postgresql", "postgres"):
            invalid("url", "must be a postgresql:// URL")
        if self.backend == "postgresql" and not (self.url or os.environ.get(DATABASE_URL_ENV)):
            invalid("url", f"is needed with backend = \"postgresql\" (or set {DATABASE_URL_ENV})")
        if not 1 <= self.job_lease_seconds <= 600:
            invalid("job_lease_seconds", "must be from 1 to 600 (seconds)")

    def __repr__(self) -> str:
        # A password in the URL must not reach a log line or a traceback through the config.
        shown = self.url if urlsplit(self.url).password is None else "postgresql://***"
        return (f"StorageConfig(path={self.path!r}, synchronous={self.synchronous!r}, "
                f"activity_log_days={self.activity_log_days!r}, backend={self.backend!r}, url={shown!r}, "
                f"job_lease_seconds={self.job_lease_seconds!r})")


class SecurityConfig(Settings):
    master_key_file: str = ""  # empty: <storage.path>/master.key
    rate_limit_per_minute: int = 12000  # per API key; 0 turns the limit off

    def __post_init__(self) -> None:
        if self.rate_limit_per_minute < 0:
            invalid("rate_limit_per_minute", "must be 0 (off) or a positive number")


DELIVERY_PROCESS_CHOICES = ("auto", "own", "shared")


class DeliveryConfig(Settings):
    allow_private_addresses: bool = False
    # Deliveries in flight at once; 0 runs no delivery worker in this process (intake only: jobs
    # wait in the database until a process with a worker runs). Deliveries mostly wait (on the
    # buyer, on commits): 64 delivered 2,176/s to a fast buyer here, 16 only 1,393/s
    # (bench/delivery.py), and more slots keep a few slow buyers from holding up the rest.
    concurrency: int = 64
    # Where the delivery worker runs: "own" a process of its own beside the server's (intake and
    # delivery each get a core), "shared" inside the server's process, "auto" own on a machine
    # with two or more cores (bench/product.py measures both).
    process: str = "auto"

    def __post_init__(self) -> None:
        if self.concurrency < 0:
            invalid("concurrency", "must be 0 (no delivery worker) or more")
        if self.process not in DELIVERY_PROCESS_CHOICES:
            invalid("process", f"must be one of {', '.join(DELIVERY_PROCESS_CHOICES)}")

    def own_process(self) -> bool:
        """Whether `appliance serve` runs the delivery worker in a process of its own."""
        if self.concurrency == 0 or self.process == "shared":
            return False
        return self.process == "own" or usable_cores() >= 2


def usable_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota (a
    container started with --cpus=1 on a large host has one core, whatever the host has)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota: the affinity is the limit
    return cores


class WebhooksConfig(Settings):
    # Events sent at once across all subscriptions; 0 sends none from this process (they wait in
    # the outbox until a process that sends runs). Private receivers follow
    # [delivery] allow_private_addresses.
    concurrency: int = 16
    timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        if self.concurrency < 0:
            invalid("concurrency", "must be 0 (send no events) or more")
        if not 0 < self.timeout_seconds <= 60:
            invalid("timeout_seconds", "must be greater than 0 and at most 60")


class TwilioConfig(Settings):
    base_url: str = "https://api.twilio.com"
    account_sid: str = ""
    auth_token: str = ""

    def __post_init__(self) -> None:
        _check_base_url("base_url", self.base_url)


class TelnyxConfig(Settings):
    base_url: str = "https://api.telnyx.com"
    api_key: str = ""
    public_key: str = ""  # base64 of the Ed25519 key Telnyx signs its webhooks with

    def __post_init__(self) -> None:
        _check_base_url("base_url", self.base_url)
        if self.public_key:
            check_ed25519_public_key("public_key", self.public_key)


class SmsConfig(Settings):
    default_provider: str = "twilio"
    twilio: TwilioConfig = msgspec.field(default_factory=TwilioConfig)
    telnyx: TelnyxConfig = msgspec.field(default_factory=TelnyxConfig)


class SocialPixelConfig(Settings):
    base_url: str = "https://graph.facebook.com"
    api_version: str = "v21.0"

    def __post_init__(self) -> None:
        _check_base_url("base_url", self.base_url)


class VideoPixelConfig(Settings):
    base_url: str = "https://business-api.tiktok.com"

    def __post_init__(self) -> None:
        _check_base_url("base_url", self.base_url)


class PixelsConfig(Settings):
    social: SocialPixelConfig = msgspec.field(default_factory=SocialPixelConfig)
    video: VideoPixelConfig = msgspec.field(default_factory=VideoPixelConfig)


class OutboundAdapterSettings(Settings):
    """`[plugins.twilio]`, `[plugins.telnyx]`, `[plugins.meta_capi]`, `[plugins.tiktok_events]`:
    the built-in adapters' own tables, checked at load like every other table (a plugin of your
    own decodes its table itself)."""

    timeout_seconds: float = 10.0
    api_version: str | None = None  # meta_capi only: overrides [pixels.social] api_version
    region: str | None = None  # pixels: the region a lead's phone is read in when it has no country

    def __post_init__(self) -> None:
        if not 0 < self.timeout_seconds <= 120:
            invalid("timeout_seconds", "must be more than 0 and at most 120")
        if self.region is not None and (len(self.region) != 2 or not self.region.isupper()):
            invalid("region", "must be a two-letter uppercase country code")


class TrustedFormSettings(Settings):
    """`[plugins.trustedform]`: where certificates are claimed (adapters/trustedform.py) and the
    account's API key, sent as HTTP basic `API:<key>` (never logged or stored)."""

    base_url: str = "https://cert.trustedform.com"
    api_key: str = ""
    timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        _check_base_url("base_url", self.base_url)
        if not 0 < self.timeout_seconds <= 120:
            invalid("timeout_seconds", "must be more than 0 and at most 120")


class DocumensoSettings(Settings):
    """`[plugins.documenso]`: the Documenso server documents are sent through
    (adapters/documenso.py), its API token and the secret its webhooks carry."""

    base_url: str = "https://app.documenso.com"
    api_key: str | None = None
    webhook_secret: str | None = None
    timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        _check_base_url("base_url", self.base_url)
        # Sent as a header value: anything else would fail every request instead of the load.
        if self.api_key is not None and not re.fullmatch(r"[\x21-\x7e]*", self.api_key):
            invalid("api_key", "must be printable ASCII without spaces")
        if not 0 < self.timeout_seconds <= 120:
            invalid("timeout_seconds", "must be more than 0 and at most 120")


class HttpLookupSettings(Settings):
    """`[plugins.http_lookup]`: the credentials of lookup services (adapters/http_lookup.py), by
    origin (`scheme://host[:port]`): headers sent with every lookup to that origin and nowhere
    else, so a campaign's config (which GET /api/v1/campaigns shows) never holds one."""

    credentials: dict[str, dict[str, str]] = {}

    def __post_init__(self) -> None:
        for origin, headers in self.credentials.items():
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") \
                    or parts.query or parts.username is not None:
                invalid("credentials", f"{origin!r} is not an origin such as https://lookup.example.com")
            for name, value in headers.items():
                if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name) or not re.fullmatch(r"[\x20-\x7e]*", value):
                    invalid(f"credentials.{origin}", "header names must be HTTP tokens, values printable ASCII")


# The built-in adapters' own [plugins.<name>] tables, and the struct each is checked with at load.
BUILTIN_PLUGIN_SETTINGS: dict[str, type[Settings]] = {
    "twilio": OutboundAdapterSettings, "telnyx": OutboundAdapterSettings, "meta_capi": OutboundAdapterSettings,
    "tiktok_events": OutboundAdapterSettings, "trustedform": TrustedFormSettings, "documenso": DocumensoSettings,
    "http_lookup": HttpLookupSettings,
}


class PluginsConfig(Settings):
    dirs: list[str] = msgspec.field(default_factory=lambda: ["./plugins"])
    strict: bool = False  # a plugin that fails to load stops start-up instead of being skipped
    # Each plugin's own [plugins.<name>] table, decoded later by that plugin into its own struct.
    tables: dict[str, dict] = {}

    def __post_init__(self) -> None:
        for name, settings in BUILTIN_PLUGIN_SETTINGS.items():
            if name in self.tables:
                try:
                    msgspec.convert(self.tables[name], settings)
                except msgspec.ValidationError as exc:
                    path, problem = describe_validation_error(exc).split(": ", 1)
                    invalid(name if path == "body" else f"{name}.{path}", problem)


    @property
    def trustedform(self) -> TrustedFormSettings:
        return msgspec.convert(self.tables.get("trustedform", {}), TrustedFormSettings)


class MetricsConfig(Settings):
    enabled: bool = True  # false: GET /metrics answers 404
    token: str = ""  # set: /metrics asks for `Authorization: Bearer <token>`


class ImportsConfig(Settings):
    max_file_mb: int = 50  # CSV lead imports (POST /api/v1/leads/import): larger files are refused unread

    def __post_init__(self) -> None:
        if self.max_file_mb < 1:
            invalid("max_file_mb", "must be at least 1")


class DefaultsConfig(Settings):
    region: str = "US"
    dedupe_window_days: int = 30

    def __post_init__(self) -> None:
        if len(self.region) != 2 or not self.region.isupper():
            invalid("region", "must be a two-letter uppercase country code")
        if self.dedupe_window_days < 0:
            invalid("dedupe_window_days", "must be 0 (off) or more")


class RetentionConfig(Settings):
    ping_days: int = 7  # suppliers' pings (and the rounds of those never posted) are kept this long
    audit_days: int = 365  # the audit log's entries

    def __post_init__(self) -> None:
        if not 1 <= self.ping_days <= 3650:
            invalid("ping_days", "must be between 1 and 3650")
        if not 1 <= self.audit_days <= 36500:
            invalid("audit_days", "must be between 1 and 36500")


class Config(Settings):
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)
    storage: StorageConfig = msgspec.field(default_factory=StorageConfig)
    security: SecurityConfig = msgspec.field(default_factory=SecurityConfig)
    delivery: DeliveryConfig = msgspec.field(default_factory=DeliveryConfig)
    webhooks: WebhooksConfig = msgspec.field(default_factory=WebhooksConfig)
    sms: SmsConfig = msgspec.field(default_factory=SmsConfig)
    pixels: PixelsConfig = msgspec.field(default_factory=PixelsConfig)
    plugins: PluginsConfig = msgspec.field(default_factory=PluginsConfig)
    defaults: DefaultsConfig = msgspec.field(default_factory=DefaultsConfig)
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    imports: ImportsConfig = msgspec.field(default_factory=ImportsConfig)
    retention: RetentionConfig = msgspec.field(default_factory=RetentionConfig)

    @property
    def log_level(self) -> str:
        return self.logging.level or self.server.log_level

    @property
    def data_dir(self) -> Path:
        return Path(self.storage.path)

    @property
    def database_url(self) -> str:
        """The PostgreSQL URL: $APPLIANCE_DATABASE_URL (so a password need not be in the file),
        else [storage] url."""
        return os.environ.get(DATABASE_URL_ENV) or self.storage.url

    @property
    def database_file(self) -> Path:
        return self.data_dir / "appliance.db"

    @property
    def master_key_path(self) -> Path:
        return Path(self.security.master_key_file) if self.security.master_key_file else self.data_dir / "master.key"


class ConfigError(Exception):
    """Start-up refuses a config it cannot read; the message names the file and the key."""


def _decode(table: dict, source: str) -> Config:
    plugins = table.get("plugins")
    if isinstance(plugins, dict):
        own = {k: v for k, v in plugins.items() if isinstance(v, dict)}
        table = {**table, "plugins": {**{k: v for k, v in plugins.items() if k not in own}, "tables": own}}
    try:
        return msgspec.convert(table, type=Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {describe_validation_error(exc)}") from None


def load_config(path: str | os.PathLike | None = None) -> Config:
    """`path`, else $APPLIANCE_CONFIG, else built-in defaults (the embedded demo set-up)."""
    path = path or os.environ.get(CONFIG_ENV) or None
    if path is None:
        return Config()
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read the config file ({exc.strerror})") from None
    try:
        table = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: not valid TOML ({exc})") from None
    return _decode(table, source)
