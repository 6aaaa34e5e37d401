"""The appliance's processes. `appliance serve` is one command on one data folder, but on a machine
with two or more cores (`[delivery] process`, appliance/config.py) it runs the delivery worker in a
process of its own: the server process answers HTTP (intake: decoding, normalization, rules, the
submit's commit), the delivery process claims jobs, calls buyers and records outcomes, and each has
a core. Both write the one SQLite file; WAL lets one process write at a time and both read.

The server starts the delivery process (`appliance _deliver`, the same program), wakes it through a
socket pair when it commits work, and watches it:
- a delivery process that ends is started again after a pause; one that keeps ending
  (GIVE_UP_AFTER times within GIVE_UP_WINDOW_SECONDS) stops the whole appliance with an error, so it
  never runs half (taking leads that nothing delivers);
- the delivery process ends when the server's end of the socket closes, however the server ended
  (kill -9 included), after finishing what it has in flight;
- it inherits the data folder's locked file (appliance/instance_lock.py): no new server starts on
  the folder while any process of the old one still runs;
- it sends its delivery counts back, so the server's /metrics counts every delivery.
Jobs the delivery process had claimed when it died are requeued by the next one at its start, as a
restarted server does (appliance/jobs/delivery.py)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from datetime import datetime, timezone
from typing import IO

import msgspec

from appliance import logs
from appliance.clock import iso
from appliance.config import Config
from appliance.instance_lock import record_processes
from appliance.metrics import Metrics

log = logging.getLogger("appliance.processes")

RESTART_PAUSE_SECONDS = 1.0
GIVE_UP_AFTER = 5  # ends of the delivery process within the window below stop the appliance
GIVE_UP_WINDOW_SECONDS = 300.0
STOP_SECONDS = 15.0  # after SIGTERM (the worker's own grace is 5 s) before the server kills it
WATCH_SECONDS = 0.5  # how often the server looks at its delivery process besides the socket's end
REPORT_SECONDS = 0.05  # how often the delivery process sends its counts, when it has any

_Counts = list[tuple[str, str, int]]  # (outcome, endpoint, deliveries)
_decode_counts = msgspec.json.Decoder(_Counts).decode


def delivery_command(config_path: str | None, channel_fd: int) -> list[str]:
    """How the server starts its delivery process: the binary runs itself, a Python install the
    package (the environment, and so $APPLIANCE_CONFIG and the working folder, are inherited)."""
    program = [sys.executable] if getattr(sys, "frozen", False) else [sys.executable, "-m", "appliance"]
    return [*program, *(["--config", config_path] if config_path else []), "_deliver",
            "--channel-fd", str(channel_fd)]


def describe_end(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


class DeliveryProcess:
    """The server's side: start, wake, watch, restart and stop the delivery process. It stands in
    for the in-process DeliveryWorker (`wake`, `run`) in appliance/app.py."""

    def __init__(self, config_path: str | None, lock: IO[str], metrics: Metrics) -> None:
        self.config_path = config_path
        self.lock = lock
        self.metrics = metrics
        self.gave_up = False  # it kept ending: the server stops, and says so
        self.starts = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._channel: socket.socket | None = None
        self._ended = asyncio.Event()
        self._received = b""
        self._wake_queued = False

    def wake(self) -> None:
        """New work may be due. Any thread may call it; one byte goes out per loop turn at most."""
        if self._wake_queued or self._channel is None or self._loop is None:
            return
        self._wake_queued = True
        if threading.get_ident() == self._loop_thread:
            self._loop.call_soon(self._send_wake)
        else:
            self._loop.call_soon_threadsafe(self._send_wake)

    def _send_wake(self) -> None:
        self._wake_queued = False
        if self._channel is not None:
            with contextlib.suppress(OSError):  # full: wakes wait unread already; gone: it restarts
                self._channel.send(b"w")

    async def run(self, stop: asyncio.Event) -> None:
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
        ends: deque[float] = deque()
        try:
            while not stop.is_set():
                proc = self._start()
                if proc is not None and not await self._watch(proc, stop):
                    return  # the server stops
                now = time.monotonic()
                ends.append(now)
                while now - ends[0] > GIVE_UP_WINDOW_SECONDS:
                    ends.popleft()
                ended = describe_end(proc.returncode) if proc is not None else "no start"
                if len(ends) >= GIVE_UP_AFTER:
                    log.critical("the delivery process ended %d times within %g s (last: %s); the appliance stops",
                                 len(ends), GIVE_UP_WINDOW_SECONDS, ended)
                    self.gave_up = True
                    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's own clean stop, lifespan included
                    return
                log.error("the delivery process ended (%s); it starts again in %g s", ended, RESTART_PAUSE_SECONDS)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), RESTART_PAUSE_SECONDS)
        finally:
            record_processes(self.lock, [])

    def _start(self) -> subprocess.Popen | None:
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen(delivery_command(self.config_path, theirs.fileno()), stdin=subprocess.DEVNULL,
                                    pass_fds=(theirs.fileno(), self.lock.fileno()))
        except OSError as exc:
            log.error("the delivery process could not start: %s", exc.strerror or type(exc).__name__)
            ours.close()
            return None
        finally:
            theirs.close()
        ours.setblocking(False)
        self._channel, self._received = ours, b""
        self._ended.clear()
        assert self._loop is not None
        self._loop.add_reader(ours.fileno(), self._read)
        self.starts += 1
        record_processes(self.lock, [{"role": "delivery", "pid": proc.pid,
                                      "since": iso(datetime.now(timezone.utc)), "starts": self.starts}])
        log.info("delivery process started (pid %d)", proc.pid)
        return proc

    async def _watch(self, proc: subprocess.Popen, stop: asyncio.Event) -> bool:
        """Until the process ends (True) or the server stops (False, the process stopped too)."""
        while proc.poll() is None:
            if stop.is_set():
                await self._stop(proc)
                return False
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._ended.wait())]
            await asyncio.wait(waiters, timeout=WATCH_SECONDS, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()
            if self._ended.is_set():  # its end of the socket closed: it is ending, reap it
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(proc.wait, WATCH_SECONDS)
                self._ended.clear()
        self._close_channel()
        return True

    async def _stop(self, proc: subprocess.Popen) -> None:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, STOP_SECONDS)
        except subprocess.TimeoutExpired:
            log.error("the delivery process (pid %d) did not stop within %g s; killed", proc.pid, STOP_SECONDS)
            proc.kill()
            await asyncio.to_thread(proc.wait)
        self._close_channel()

    def _close_channel(self) -> None:
        if self._channel is not None:
            assert self._loop is not None
            self._loop.remove_reader(self._channel.fileno())
            self._channel.close()
            self._channel = None

    def _read(self) -> None:
        assert self._channel is not None
        try:
            data = self._channel.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_channel()
            self._ended.set()
            return
        *lines, self._received = (self._received + data).split(b"\n")
        for line in lines:
            try:
                counts = _decode_counts(line)
            except msgspec.DecodeError:
                log.error("the delivery process sent counts this server cannot read")
                continue
            for outcome, endpoint, n in counts:
                self.metrics.deliveries[(outcome, endpoint)] += n


def run_delivery_process(config: Config, channel_fd: int) -> None:
    """`appliance _deliver`: the delivery worker alone, for the server that started it."""
    from appliance.jobs.delivery import DeliveryWorker
    from appliance.plugins import load_plugins
    from appliance.runtime import open_runtime
    from appliance.services.tenant_settings import SettingsCache

    logs.configure(config.logging.format, config.log_level, process="delivery")
    # A terminal's Ctrl-C reaches the whole process group: the server stops this process itself,
    # after the requests it is answering, and must not find it gone and start it again.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel = socket.socket(fileno=channel_fd)
    channel.setblocking(False)
    runtime = open_runtime(config)
    try:
        registry = load_plugins(config)
        worker = DeliveryWorker(runtime, SettingsCache(runtime.store, plugins_listen=registry.listens_to_lead_events),
                                registry, concurrency=max(config.delivery.concurrency, 1))
        gc.collect()
        gc.freeze()  # as `serve` does (appliance/cli.py)
        gc.set_threshold(10_000, 10, 10)

        async def main() -> None:
            loop, stop = asyncio.get_running_loop(), asyncio.Event()
            loop.add_signal_handler(signal.SIGTERM, stop.set)

            def readable() -> None:
                try:
                    data = channel.recv(4096)
                except BlockingIOError:
                    return
                except OSError:
                    data = b""
                if data:
                    worker.wake()
                    return
                loop.remove_reader(channel_fd)
                log.warning("the server process ended; the delivery process stops")
                stop.set()

            loop.add_reader(channel_fd, readable)
            reporter = asyncio.create_task(_report_counts(channel, runtime.metrics, stop))
            try:
                await worker.run(stop)
            finally:
                stop.set()
                await reporter

        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(main())
    finally:
        runtime.close()
        channel.close()


async def _report_counts(channel: socket.socket, metrics: Metrics, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while True:
        stopping = stop.is_set()
        if metrics.deliveries:
            counts = [(outcome, endpoint, n) for (outcome, endpoint), n in metrics.deliveries.items()]
            metrics.deliveries.clear()
            try:
                await loop.sock_sendall(channel, msgspec.json.encode(counts) + b"\n")
            except OSError:
                return  # the server is gone: nobody to count for
        if stopping:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), REPORT_SECONDS)


def _loop_factory():  # noqa: ANN202 - an event loop class
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop
