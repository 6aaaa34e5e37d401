"""Start-up time of `appliance serve`: from launching the process to the first 200 from /healthz.

Two variants, each run N times (default 5), every run with a fresh data dir and a free port:
  python   the Python install: <venv>/bin/appliance (or `<venv>/bin/python -m appliance` with
           --module, or when the venv has no console script)
  binary   the one-file executable dist/appliance (skipped when it has not been built; build it
           with `pyinstaller --noconfirm --clean build.spec`)
`appliance init` runs first for each data dir and is not timed; only `serve` is. One untimed
warm-up run per variant (--warmup) fills the OS file cache so the figures are steady-state; use
--warmup 0 for cold-ish numbers. A one-file binary unpacks itself into a temp dir on every start,
so its figure includes that.

Targets (printed next to the figures; this is a benchmark, not a test: misses do not fail it):
python < 1 s, binary < 2 s.

Usage (from the repo root):
    .venv/bin/python bench/startup.py
    /tmp/venv/bin/python bench/startup.py -n 10 --venv /tmp/venv --binary dist/appliance
    python bench/startup.py --only binary --warmup 0

Only 127.0.0.1 is used; every wait is bounded (--timeout per start, 10 s per stop); every process
started is killed (its whole process group, which includes the binary's unpacked child) before the
next run and on exit, also on Ctrl-C. Exit status 0 unless a variant never came up.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"python": 1.0, "binary": 2.0}
POLL_INTERVAL = 0.01


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthz_ok(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, SIGKILL it after 10 s; always reap."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    try:  # the group may outlive its leader (the one-file bootloader's child)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def one_run(command: list[str], timeout: float) -> float | None:
    """Seconds from Popen to the first /healthz 200, or None when it never came up."""
    work = Path(tempfile.mkdtemp(prefix="appliance-bench-"))
    try:
        port = free_port()
        config = work / "appliance.toml"
        config.write_text(
            f'[server]\nhost = "127.0.0.1"\nport = {port}\nlog_level = "warning"\n\n'
            f'[storage]\npath = "{work / "data"}"\n\n[plugins]\ndirs = []\n')
        env = {**os.environ, "APPLIANCE_CONFIG": str(config)}
        subprocess.run([*command, "init"], env=env, cwd=work, check=True, timeout=60,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        log = (work / "serve.log").open("wb")
        started = time.perf_counter()
        proc = subprocess.Popen([*command, "serve"], env=env, cwd=work, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = started + timeout
            while time.perf_counter() < deadline:
                if healthz_ok(port):
                    return time.perf_counter() - started
                if proc.poll() is not None:
                    break
                time.sleep(POLL_INTERVAL)
            log.flush()
            tail = (work / "serve.log").read_text(errors="replace")[-2000:]
            print(f"  serve did not answer /healthz within {timeout:.0f} s "
                  f"(exit status {proc.poll()}); log tail:\n{tail}", file=sys.stderr)
            return None
        finally:
            stop(proc)
            log.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def python_command(venv: Path, module: bool) -> list[str]:
    script = venv / "bin" / "appliance"
    if script.exists() and not module:
        return [str(script)]
    return [str(venv / "bin" / "python"), "-m", "appliance"]


def main() -> int:
    default_venv = Path(sys.prefix) if sys.prefix != sys.base_prefix else ROOT / ".venv"
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--runs", type=int, default=5, help="timed runs per variant (5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (1)")
    parser.add_argument("--venv", type=Path, default=default_venv, help=f"venv ({default_venv})")
    parser.add_argument("--module", action="store_true", help="python variant as `python -m appliance`")
    parser.add_argument("--binary", type=Path, default=ROOT / "dist" / "appliance")
    parser.add_argument("--only", choices=["python", "binary"], help="run one variant")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait per start (30)")
    args = parser.parse_args()

    variants: dict[str, list[str]] = {}
    if args.only in (None, "python"):
        variants["python"] = python_command(args.venv, args.module)
    if args.only in (None, "binary"):
        if args.binary.exists():
            variants["binary"] = [str(args.binary.resolve())]
        else:
            print(f"binary: {args.binary} not built, skipped")

    results: dict[str, list[float] | None] = {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for name, command in variants.items():
        print(f"{name}: {' '.join(command)} serve  ({args.warmup} warm-up + {args.runs} runs)", flush=True)
        times: list[float] | None = []
        for i in range(args.warmup + args.runs):
            took = one_run(command, args.timeout)
            if took is None:
                times = None
                break
            if i >= args.warmup:
                times.append(took)
                print(f"  run {i - args.warmup + 1}: {took:.3f} s", flush=True)
        results[name] = times

    print()
    print(f"{'variant':<8} {'runs':>4} {'median':>8} {'max':>8} {'target':>8}  verdict")
    for name, times in results.items():
        target = TARGETS[name]
        if not times:
            print(f"{name:<8} {0:>4} {'-':>8} {'-':>8} {f'< {target:.0f} s':>8}  never answered /healthz")
            continue
        median, worst = statistics.median(times), max(times)
        verdict = "met" if worst < target else ("median met, max missed" if median < target else "missed")
        print(f"{name:<8} {len(times):>4} {median:>7.3f}s {worst:>7.3f}s {f'< {target:.0f} s':>8}  {verdict}")
    return 1 if any(t is None for t in results.values()) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
