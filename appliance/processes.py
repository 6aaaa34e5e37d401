"""The appliance's processes. `appliance serve` is one command on one data folder, but on a machine
with two or more cores (`[delivery] process`, appliance/config.py) it runs the delivery worker in a
process of its own: the server process answers HTTP (intake: decoding, normalization, rules, the
submit's commit), the delivery process claims jobs, calls buyers and records outcomes, and each has
a core. Both write the one SQLite file; WAL lets one process write at a time and both read.

The server starts the delivery process (`appliance _deliver`, the same program) with a socket pair
between them and watches it:
- the server sends its version and its configuration first, so a restarted delivery process works
  on what the server works on even if the config file or the program changed since (a program of
  another version refuses to run, and the appliance stops: a restart runs one version again);
- then one byte whenever it committed work (at most one a loop turn), which wakes the delivery
  process; the delivery process sends its delivery counts back (for /metrics), at least once a
  second, which tells the server it is alive;
- a delivery process that ends, or says nothing for HEARTBEAT_TIMEOUT_SECONDS (hung: it is
  killed), is started again after a pause; one that keeps ending (GIVE_UP_AFTER times within
  GIVE_UP_WINDOW_SECONDS) stops the whole appliance with exit code 1, never leaving it half
  running (taking leads that nothing delivers);
- the delivery process stops when its end of the socket closes: the server closes it to stop it,
  and the operating system closes it when the server ends however it ends (kill -9 included). It
  finishes the deliveries in flight first (a few seconds), and ignores SIGTERM, SIGINT and SIGHUP,
  which a service manager or a terminal sends to the whole group: only the server decides when it
  stops (SIGHUP, the server's certificate reload, is the server's alone);
- it inherits the data folder's locked file (appliance/instance_lock.py): no new server runs on
  the folder while any process of the old one still does.
Jobs a delivery process had claimed when it died are requeued by the next one at its start, as a
restarted server does (appliance/jobs/delivery.py; on PostgreSQL once their lease ran out)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime, timezone
from typing import IO

import msgspec

from appliance import __version__, logs
from appliance.clock import iso
from appliance.config import Config
from appliance.instance_lock import record_processes
from appliance.metrics import Metrics
from appliance.storage import hand_over_the_gil_quickly

log = logging.getLogger("appliance.processes")

RESTART_PAUSE_SECONDS = 1.0
GIVE_UP_AFTER = 5  # ends of the delivery process within the window below stop the appliance
GIVE_UP_WINDOW_SECONDS = 300.0
STOP_SECONDS = 15.0  # after its socket closed (the worker's own grace is 5 s) before it is killed
WATCH_SECONDS = 0.5  # how often the server looks at its delivery process besides the socket
REPORT_SECONDS = 0.05  # how often the delivery process sends its counts, when it has any
HEARTBEAT_SECONDS = 1.0  # it sends at least this often, counts or not
HEARTBEAT_TIMEOUT_SECONDS = 15.0
START_MESSAGE_SECONDS = 10.0
EXIT_OTHER_VERSION = 78  # sysexits EX_CONFIG: told apart from a crash, which restarts


class _Start(msgspec.Struct):
    """The server's first message to its delivery process."""
    version: str
    config: Config


_Counts = list[tuple[str, str, int]]  # (outcome, endpoint, deliveries)
_decode_counts = msgspec.json.Decoder(_Counts).decode


def delivery_command(channel_fd: int) -> list[str]:
    """How the server starts its delivery process: the binary runs itself, a Python install the
    package."""
    program = [sys.executable] if getattr(sys, "frozen", False) else [sys.executable, "-m", "appliance"]
    return [*program, "_deliver", "--channel-fd", str(channel_fd)]


def _environment() -> dict[str, str]:
    environment = dict(os.environ)
    if getattr(sys, "frozen", False):
        # The one-file binary's child would share the server's unpacked files, which are deleted
        # when the server ends, while the delivery process still finishes its deliveries.
        environment["PYINSTALLER_RESET_ENVIRONMENT"] = "1"
    return environment


def describe_end(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


class DeliveryProcess:
    """The server's side: start, wake, watch, restart and stop the delivery process. It stands in
    for the in-process DeliveryWorker (`wake`, `run`) in appliance/app.py. `stop_server` makes the
    server stop cleanly; `gave_up` then tells why."""

    def __init__(self, config: Config, lock: IO[str], metrics: Metrics) -> None:
        self.config = config
        self.lock = lock
        self.metrics = metrics
        self.stop_server: Callable[[], None] = lambda: None
        self.gave_up: str | None = None
        self.starts = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._channel: socket.socket | None = None
        self._ended = asyncio.Event()
        self._received = b""
        self._heard = 0.0
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
        try:
            await self._supervise(stop)
        except Exception:  # the appliance must not go on taking leads that nothing delivers
            log.critical("watching the delivery process failed; the appliance stops", exc_info=True)
            self._give_up("watching the delivery process failed")
        finally:
            self._record([])

    async def _supervise(self, stop: asyncio.Event) -> None:
        ends: deque[float] = deque()
        while not stop.is_set():
            proc = self._start()
            if proc is not None and not await self._watch(proc, stop):
                return  # the server stops
            now = time.monotonic()
            ends.append(now)
            while now - ends[0] > GIVE_UP_WINDOW_SECONDS:
                ends.popleft()
            ended = describe_end(proc.returncode) if proc is not None else "it could not start"
            if proc is not None and proc.returncode == EXIT_OTHER_VERSION:
                self._give_up("the program was replaced since the server started: start the appliance again")
                return
            if len(ends) >= GIVE_UP_AFTER:
                log.critical("the delivery process ended %d times within %g s (last: %s); the appliance stops",
                             len(ends), GIVE_UP_WINDOW_SECONDS, ended)
                self._give_up(f"the delivery process ended {len(ends)} times within {GIVE_UP_WINDOW_SECONDS:g} s "
                              "(its log lines say why)")
                return
            log.error("the delivery process ended (%s); it starts again in %g s", ended, RESTART_PAUSE_SECONDS)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), RESTART_PAUSE_SECONDS)

    def _give_up(self, why: str) -> None:
        self.gave_up = why
        self.stop_server()

    def _record(self, processes: list[dict]) -> None:
        try:
            record_processes(self.config.data_dir, processes)
        except OSError as exc:  # doctor shows less; delivery goes on
            log.warning("cannot record the delivery process for doctor: %s", exc.strerror or type(exc).__name__)

    def _start(self) -> subprocess.Popen | None:
        ours = theirs = None
        try:
            ours, theirs = socket.socketpair()
            proc = subprocess.Popen(delivery_command(theirs.fileno()), stdin=subprocess.DEVNULL,
                                    pass_fds=(theirs.fileno(), self.lock.fileno()), env=_environment())
        except OSError as exc:
            log.error("the delivery process could not start: %s", exc.strerror or type(exc).__name__)
            if ours is not None:
                ours.close()
            return None
        finally:
            if theirs is not None:
                theirs.close()
        try:  # once it runs: it reads this first, so a configuration of any size goes through
            ours.sendall(msgspec.json.encode(_Start(version=__version__, config=self.config)) + b"\n")
        except OSError as exc:
            log.error("the delivery process could not be told its configuration: %s", exc.strerror or type(exc).__name__)
            ours.close()
            proc.kill()
            proc.wait()
            return None
        ours.setblocking(False)
        self._channel, self._received, self._heard = ours, b"", time.monotonic()
        self._ended.clear()
        assert self._loop is not None
        self._loop.add_reader(ours.fileno(), self._read)
        self.starts += 1
        self._record([{"role": "delivery", "pid": proc.pid, "since": iso(datetime.now(timezone.utc)),
                       "starts": self.starts}])
        log.info("delivery process started (pid %d)", proc.pid)
        return proc

    async def _watch(self, proc: subprocess.Popen, stop: asyncio.Event) -> bool:
        """Until the process ends (True) or the server stops (False, the process stopped too)."""
        while proc.poll() is None:
            if stop.is_set():
                await self._stop(proc)
                return False
            if time.monotonic() - self._heard > HEARTBEAT_TIMEOUT_SECONDS:
                log.error("the delivery process (pid %d) said nothing for %g s; killed", proc.pid,
                          HEARTBEAT_TIMEOUT_SECONDS)
                proc.kill()
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
        self._close_channel()  # its signal to finish what it has in flight and end
        try:
            await asyncio.to_thread(proc.wait, STOP_SECONDS)
        except subprocess.TimeoutExpired:
            log.error("the delivery process (pid %d) did not stop within %g s; killed", proc.pid, STOP_SECONDS)
            proc.kill()
            await asyncio.to_thread(proc.wait)
        log.info("delivery process stopped")

    def _close_channel(self) -> None:
        if self._channel is not None:
            assert self._loop is not None
            self._loop.remove_reader(self._channel.fileno())
            self._channel.close()
            self._channel = None

    def _read(self) -> None:
        assert self._channel is not None
        data = _receive(self._channel)
        if data is None:
            return
        if not data:
            self._close_channel()
            self._ended.set()
            return
        self._heard = time.monotonic()
        *lines, self._received = (self._received + data).split(b"\n")
        for line in lines:
            try:
                counts = _decode_counts(line)
            except msgspec.DecodeError:
                log.error("the delivery process sent counts this server cannot read")
                continue
            for outcome, endpoint, n in counts:
                self.metrics.deliveries[(outcome, endpoint)] += n


def _receive(channel: socket.socket) -> bytes | None:
    """What the other process sent: None when nothing is there yet, b"" once it closed its end
    (or ended)."""
    try:
        return channel.recv(65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def run_delivery_process(channel_fd: int) -> int:
    """`appliance _deliver`: the delivery worker alone, for the server that started it. Returns
    the process's exit code."""
    # A service manager's SIGTERM and a terminal's Ctrl-C reach the whole process group: the
    # server stops this process itself (by closing the socket) once it has stopped taking requests.
    # SIGHUP (the server's "load the certificate again", a closed terminal) must not end it either.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    channel = socket.socket(fileno=channel_fd)
    start = _read_start(channel)
    if start is None:
        return 1
    config = start.config
    if config.storage.synchronous.upper() == "FULL":
        # Its commits (claims, outcomes) need not reach the disk before it goes on: a power loss
        # that takes the last of them sends those leads again (at least once, the same
        # Idempotency-Key), as a crash mid-delivery does, while every lead a 2xx acknowledged is
        # the server's FULL commit, whose sync also carries all commits written before it. One
        # sync less per commit made submit-to-delivered p50 9.0, 8.2, 11.2 ms against 11.9, 14.4,
        # 21.1 ms at 1,000 leads/s (bench.product, alternating runs).
        config = msgspec.structs.replace(config, storage=msgspec.structs.replace(config.storage, synchronous="NORMAL"))
    logs.configure(config.logging.format, config.log_level, process="delivery")
    if start.version != __version__:
        log.critical("this program is version %s, the server %s: the program was replaced while the server "
                     "ran", __version__, start.version)
        return EXIT_OTHER_VERSION
    from appliance.jobs.delivery import DeliveryWorker
    from appliance.plugins import PluginError, load_plugins
    from appliance.runtime import open_runtime
    from appliance.services.tenant_settings import SettingsCache
    from appliance.crypto import SecretError
    from uvicorn.loops.auto import auto_loop_factory
    from appliance.storage import StorageError

    try:
        # As `serve` does: an unreachable PostgreSQL is waited for, the worker's claims meanwhile
        # retried with backoff (appliance/jobs/outage.py).
        runtime = open_runtime(config, keep_trying=True)
    except (StorageError, SecretError) as exc:
        log.critical("the delivery process cannot open the install: %s", exc)
        return 1
    try:
        try:
            registry = load_plugins(config)
        except PluginError as exc:
            log.critical("the delivery process cannot load its plugins: %s", exc)
            return 1
        worker = DeliveryWorker(runtime, SettingsCache(runtime.store, plugins_listen=registry.listens_to_lead_events),
                                registry, concurrency=max(config.delivery.concurrency, 1))
        settle_for_serving()
        channel.setblocking(False)
        with asyncio.Runner(loop_factory=auto_loop_factory()) as runner:  # the server's loop (uvloop)
            runner.run(_deliver(worker, runtime.metrics, channel))
        return 0
    finally:
        runtime.close()
        channel.close()


def settle_for_serving() -> None:
    """Once a serving process (the server, the delivery process) has loaded what it runs."""
    # What exists now (modules, config, routes, the OpenAPI document) lives as long as the
    # process: out of the collector's sight, a full collection no longer walks it. Measured
    # (bench.submit, alternating runs): submit p99 38-42 ms instead of 51-53 ms.
    gc.collect()
    gc.freeze()
    # A submit allocates a few hundred tracked objects, nearly all freed by reference counts; at
    # the default threshold (700) the young generation was collected every few submits, ~10 us
    # of each (bench/HISTORY.md). Cycles still go, a few thousand objects later.
    gc.set_threshold(10_000, 10, 10)
    hand_over_the_gil_quickly()  # to the database's writer thread


def _read_start(channel: socket.socket) -> _Start | None:
    received = b""
    deadline = time.monotonic() + START_MESSAGE_SECONDS
    while b"\n" not in received:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([channel], [], [], left)[0]:
            print("error: the server sent the delivery process nothing", file=sys.stderr)
            return None
        data = channel.recv(1 << 20)
        if not data:
            print("error: the server ended before the delivery process started", file=sys.stderr)
            return None
        received += data
    try:
        return msgspec.json.decode(received.split(b"\n", 1)[0], type=_Start)
    except msgspec.DecodeError as exc:  # malformed, or not what this version expects
        print(f"error: the server's start message is not understood: {exc}", file=sys.stderr)
        return None


async def _deliver(worker, metrics: Metrics, channel: socket.socket) -> None:  # noqa: ANN001 - DeliveryWorker
    loop, stop = asyncio.get_running_loop(), asyncio.Event()

    def readable() -> None:
        data = _receive(channel)
        if data is None:
            return
        if data:
            worker.wake()
            return
        loop.remove_reader(channel.fileno())
        log.info("the server closed the channel (it stops, or it ended): the delivery process stops")
        stop.set()

    loop.add_reader(channel.fileno(), readable)
    reporter = asyncio.create_task(_report_counts(channel, metrics, stop))
    try:
        await worker.run(stop)
    finally:
        stop.set()
        await reporter


async def _report_counts(channel: socket.socket, metrics: Metrics, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    sent = time.monotonic()
    while True:
        stopping = stop.is_set()
        if metrics.deliveries or time.monotonic() - sent >= HEARTBEAT_SECONDS:
            counts = [(outcome, endpoint, n) for (outcome, endpoint), n in metrics.deliveries.items()]
            metrics.deliveries.clear()
            try:
                await loop.sock_sendall(channel, msgspec.json.encode(counts) + b"\n")
            except OSError:
                return  # the server is gone: nobody to count for
            sent = time.monotonic()
        if stopping:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), REPORT_SECONDS)
