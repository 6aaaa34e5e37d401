"""Instructions a submit and a delivery execute, counted by valgrind: a figure that stays put
while the machine's speed does not.

    python -m bench.instructions [--small 1000] [--large 3000]

On a shared virtual machine the same CPU-time benchmark can move by half between two runs, so a
change worth a few per cent cannot be told apart from the machine (bench/README.md). valgrind's
callgrind counts the instructions a process executes instead, the same to about 1 % run after
run (how writes group and when the worker claims still depend on timing), whatever else the
machine does. This runs bench.submit_profile (`--top 0`)
and bench.delivery_profile each twice under callgrind, with `--small` and `--large` leads, and
divides the difference by the leads between them, which takes out the start-up and the warm-up:
instructions a submit (bench.submit's tenant, the app through ASGI, no sockets) and a delivered
lead: bench.product's tenant's submit and delivery less the first figure, so the worker, its
exchange with the buyer and its writes, plus what that tenant's submit adds (its deliver job); the
buyer is another process, not counted. The two runs of each go side by side, one a core.

What it does not see: time in the kernel (system calls, fsync, the loopback), cache misses and
waiting. Read it beside bench.product, for changes to Python work; compare two trees by running
it in each (`PYTHONPATH=<tree>`)."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.campaigns_list import ROOT

_TOTALS = re.compile(r"^totals: (\d+)$", re.MULTILINE)
WARMUP = 500  # leads bench.submit_profile and bench.delivery_profile run before they measure


def counted(module: str, leads_flag: str, leads: int, extra: list[str], work: Path) -> subprocess.Popen:
    out = work / f"{module}.{leads}"
    with open(f"{out}.out", "wb") as printed:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.callgrind", f"--log-file={out}.valgrind",
             sys.executable, "-m", module, leads_flag, str(leads), *extra], cwd=ROOT, stdout=printed,
            stderr=subprocess.STDOUT)


def instructions(module: str, leads_flag: str, leads: int, work: Path, check: str, status: int) -> int:
    out = work / f"{module}.{leads}"
    printed = Path(f"{out}.out").read_text(errors="replace")
    if status != 0 or check not in printed or "warning" in printed:
        raise RuntimeError(f"{module} with {leads} leads did not do its work (exit {status}):\n{printed[-2000:]}")
    found = _TOTALS.search(Path(f"{out}.callgrind").read_text(errors="replace"))
    if found is None:
        raise RuntimeError(f"no instruction total from callgrind for {module}")
    return int(found.group(1))


def per_lead(module: str, leads_flag: str, small: int, large: int, extra: list[str], work: Path,
             check: str) -> float:
    """Instructions per lead between a run of `small` and one of `large`."""
    runs = [counted(module, leads_flag, n, extra, work) for n in (small, large)]
    try:
        statuses = [run.wait() for run in runs]
    finally:
        for run in runs:  # after a failure or Ctrl-C, before their folder goes
            if run.poll() is None:
                run.kill()
                run.wait()
    totals = [instructions(module, leads_flag, n, work, check.format(n=n), status)
              for n, status in zip((small, large), statuses)]
    return (totals[1] - totals[0]) / (large - small)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=3000)
    args = parser.parse_args(argv)
    if not WARMUP <= args.small < args.large:
        # Both profiles warm up with min(500, leads) first: below 500 the two runs' warm-ups differ.
        parser.error(f"--small must be at least {WARMUP} and below --large")
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-instructions-"))
    try:
        submit = per_lead("bench.submit_profile", "--requests", args.small, args.large, ["--top", "0"], work,
                          "{n} submits, 64 at a time: statuses {{201: {n}}}")
        # A round of bench.delivery_profile commits its leads' submits, then delivers them.
        both = per_lead("bench.delivery_profile", "--leads", args.small, args.large, [], work,
                        "{n} submits (statuses {{201: {n}}}), {n} delivered")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"instructions a submit: {submit / 1000:.1f} K")
    print(f"instructions a delivered lead: {(both - submit) / 1000:.1f} K (with its submit: {both / 1000:.1f} K)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
