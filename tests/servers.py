"""Real servers for tests (this module holds no tests): the app under uvicorn in a thread, the
config file such tests start from, and a person to submit."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from appliance.app import create_app
from appliance.runtime import Runtime
from tests.processes import free_port


@contextlib.contextmanager
def live_server(runtime: Runtime, *, background: bool = True, registry=None,
                log_level: str = "warning") -> Iterator[str]:
    """The real app under uvicorn in a thread; yields its base URL and stops it on exit."""
    port = free_port()
    app = create_app(runtime, background=background, registry=registry)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level=log_level, lifespan="on",
                            access_log=False)
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # not the main thread
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped during start-up"
        assert time.monotonic() < deadline, "uvicorn did not start within 10 s"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        assert not thread.is_alive(), "uvicorn did not stop within 15 s"


def write_config(tmp_path: Path, *, rate_limit: int = 0, extra: str = "", backend: str = "") -> Path:
    """`backend`: the test's `[storage]` backend lines (fixtures `backend_toml`, `module_backend_toml`)."""
    path = tmp_path / "appliance.toml"
    path.write_text(f'[storage]\npath = "{tmp_path / "data"}"\n{backend}\n[security]\nrate_limit_per_minute = {rate_limit}\n\n'
                    f'[plugins]\ndirs = ["{tmp_path / "plugins"}"]\n{extra}')
    return path


def person(n: int) -> dict:
    return {"firstName": "Jane", "lastName": f"Doe{n}", "email": f"jane{n}@example.com",
            "phone": f"+1415555{n % 10000:04d}"}
