"""What the same small piece of work costs in CPU right after the thread ran, and after it slept.

    python -m bench.wakeup_cost [--rounds 400] [--work 10]

A server at a moderate rate wakes for each request and sleeps between them; under saturation it
runs one request after another. On some machines (virtual ones sharing a physical core, or with
frequency scaling) work done just after waking runs several times slower, so CPU per lead at a
fixed rate can be far above the saturated figure (bench/README.md, bench.product). Prints the
median and mean thread CPU time of one unit of work (`--work` encodes of a small JSON document)
with no pause between units and after sleeps of 0.2, 1 and 10 ms."""

from __future__ import annotations

import argparse
import json
import statistics
import time

_DOC = {"email": "someone@example.com", "phone": "+15555550100", "answers": list(range(40)),
        "address": {"street": "1 Main St", "city": "Springfield", "zip": "12345"}}


def _unit(repeat: int) -> int:
    return sum(len(json.dumps(_DOC)) for _ in range(repeat))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wakeup_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--work", type=int, default=10)
    args = parser.parse_args(argv)
    for pause in (0.0, 0.0002, 0.001, 0.01):
        costs = []
        for _ in range(args.rounds):
            started = time.thread_time()
            _unit(args.work)
            costs.append(time.thread_time() - started)
            if pause:
                time.sleep(pause)
        print(f"pause {pause * 1000:5.1f} ms: median {statistics.median(costs) * 1e6:6.0f} us, "
              f"mean {statistics.fmean(costs) * 1e6:6.0f} us per unit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
