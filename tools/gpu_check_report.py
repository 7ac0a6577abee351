#!/usr/bin/env python3
"""The verdicts and tables of tools/gpu_check.sh, each a subcommand.

  gtest LOG... [--list LIST] [--gpus N] [--free-gib G] [--allow-skips]
        GoogleTest logs taken together (the shards of one suite and their reruns): every test passed,
        none crashed or hung, none of LIST (--gtest_list_tests) went unrun, and none skipped unless it
        needs more GPUs or more free device memory than this machine has (its skip message says
        'needs N GPUs', 'needs N CUDA devices' or 'needs N GiB'). One line; exit 1 on failure.
  shards LIST LOG... [--unreached FILE]
        what became of each shard: ran to the end (with how many failures), or crashed or hung in a
        named test with so many of its tests never started; FILE gets the tests of LIST that no log
        started, one per line, for a rerun with --gtest_filter
  track GPU.jsonl CPU.jsonl --precision bf16|fp8|same-gpu --steps K
        train_vit's losses on the GPU follow its CPU twin (or another GPU run) over the first K steps
  falls RUN.jsonl
        the loss falls: the mean of the last 5 steps is at most 0.85 of the first 5
  kernels CSV[.gz]... [--top N]
        Nsight Compute captures (--csv --page raw with gpu__time_duration.sum) summed per kernel
        category and per kernel, with launches and microseconds per launch
  metrics CSV[.gz]
        an Nsight Compute capture with the SpeedOfLight, LaunchStats, Occupancy, WarpStateStats and
        MemoryWorkloadAnalysis sections (--csv --page raw), one line per kernel: time, DRAM bytes
        moved, throughput, occupancy, waves, and the warps' top stall reasons
  choose BENCH.jsonl [--kernels BENCH_KERNELS.log]
        the bench_vit flags that won their trials in this check, one line per precision ("bf16: FLAGS",
        "fp8: FLAGS", empty where the library's defaults won or nothing on trial ran), then a "why:"
        line for each decision: --autotune on by the step's images/s against the run without it;
        --bias-grad epilogue by bench_kernels' rows of the kernels it changes
  table BENCH.jsonl --device TEXT --model NAME --batch N [--commit C] [--date D]
        the benchmark table in bench/RESULTS.md's format: Octet bf16, fp8 (fused producers on and
        off) and bf16 with recompute beside PyTorch eager and torch.compile, and the goals

Standard library only: it runs on a GPU machine beside PyTorch and here alike. The subcommands
kernels, metrics, choose and table are in tools/gpu_check_bench.py.
"""
import argparse
import json
import os
import re
import sys

from gpu_check_bench import choose, kernels, metrics, table  # the benchmark side: python3 puts this folder first on the path

# ---- GoogleTest logs ---------------------------------------------------------------------------------------

RUN = re.compile(r"^\[ RUN      \] (\S+)")
RESULT = re.compile(r"^\[ +(OK|FAILED|SKIPPED) +\] (\S+?),?(?: |$)")
FINISHED = re.compile(r"^\[==========\] \d+ tests? from .* ran\.")
SHARD = re.compile(r"^Note: This is test shard (\d+) of (\d+)\.")
# What tools/gpu_check.sh appends to a log when the program did not exit 0.
MARKER = re.compile(r"^gpu_check: (?:exit (\d+)|timed out after (\d+) ?s)")
OUTCOMES = {"OK": "passed", "FAILED": "failed", "SKIPPED": "skipped"}


class GtestLog:
    """One GoogleTest log, read line by line: each test's outcome and message, the test that was
    running when the log ends (the program crashed there, or hung and was killed), whether the
    program reached its summary, its shard, and the exit status gpu_check recorded."""

    def __init__(self, path):
        self.path, self.name = path, os.path.basename(path)
        self.tests = {}          # name -> (outcome, message), in the order they ran
        self.started = []        # every test that started, in order
        self.interrupted = None  # the test that started and never ended
        self.finished = False
        self.shard = None        # (index from 0, total)
        self.exit = None
        self.timed_out = None    # seconds
        self.missing = False     # no log at all: the program never ran
        try:
            text = re.sub(r"\x1b\[[0-9;]*m", "", open(path, errors="replace").read())
        except OSError:
            text, self.missing = "", True
        current, lines = None, []
        for line in text.splitlines():
            m = RUN.match(line)
            if m:
                if current is not None:  # a test began while another never ended: that one was cut off
                    self.tests[current] = ("interrupted", " ".join(lines))
                current, lines = m.group(1), []
                self.started.append(current)
                continue
            m = RESULT.match(line)
            if m and m.group(2) == current:
                self.tests[current] = (OUTCOMES[m.group(1)], " ".join(s.strip() for s in lines if s.strip()))
                current = None
                continue
            if m and m.group(1) == "FAILED" and "." in m.group(2) and current is None:
                # GoogleTest's closing list of failures: a test named there failed, whatever came before
                self.tests[m.group(2)] = ("failed", self.tests.get(m.group(2), ("", ""))[1])
            if current is not None:
                lines.append(line)
            if FINISHED.match(line):
                self.finished = True
            m = SHARD.match(line)
            if m:
                self.shard = (int(m.group(1)) - 1, int(m.group(2)))
            m = MARKER.match(line)
            if m:
                if m.group(1) is not None:
                    self.exit = int(m.group(1))
                else:
                    self.timed_out = int(m.group(2))
        if current is not None:
            self.interrupted = current
            self.tests[current] = ("interrupted", " ".join(s.strip() for s in lines if s.strip()))

    def how_it_ended(self):
        """'crashed (exit 139)', 'hung (timed out after 150 s)', or 'stopped' when nothing says why."""
        if self.missing:
            return "never ran (no log)"
        if self.timed_out is not None:
            return f"hung (timed out after {self.timed_out} s)"
        if self.exit is not None:
            return f"crashed (exit {self.exit})"
        return "stopped (no exit status recorded)"

    def count(self, outcome):
        return sum(1 for o, _ in self.tests.values() if o == outcome)


def read_test_list(path):
    """Test names from --gtest_list_tests, in GoogleTest's order: 'Suite.' lines, then indented test
    names, each possibly followed by '# GetParam() = ...'. DISABLED_ tests are left out: they
    neither run nor count in GoogleTest's sharding."""
    names, suite = [], None
    for line in open(path, errors="replace"):
        if not line.strip() or line.startswith("Running main()"):
            continue
        if not line[0].isspace():
            suite = line.split()[0]
            suite = suite if suite.endswith(".") else None
        elif suite:
            test = line.split()[0]
            if not suite.startswith("DISABLED_") and "/DISABLED_" not in suite and not test.startswith("DISABLED_"):
                names.append(suite + test)
    return names


def shard_of(names, index, total):
    """The tests GoogleTest gives shard `index` of `total`: the j-th runnable test goes to shard
    j mod total (GoogleTest's ShouldRunTestOnShard). --gtest_list_tests ignores the shard variables,
    so the shard's list is worked out here."""
    return [n for j, n in enumerate(names) if j % total == index]


def shards(args):
    names = read_test_list(args.list)
    logs = [GtestLog(p) for p in args.logs]
    for log in logs:
        label = f"{log.name}" + (f" (shard {log.shard[0] + 1} of {log.shard[1]})" if log.shard else "")
        counts = f"{log.count('passed')} passed, {log.count('failed')} failed, {log.count('skipped')} skipped"
        if log.interrupted is None and log.finished:
            odd = log.exit is not None and (log.exit != 1 or log.count("failed") == 0)
            print(f"{label}: ran to the end: {counts}" + (f"; but exited {log.exit}" if odd else ""))
            continue
        own = ""
        if log.shard:
            mine = shard_of(names, *log.shard)
            outside = [n for n in log.started if n not in set(mine)]
            if outside:
                own = f"; its tests do not match GoogleTest's sharding of the list ({len(outside)} started outside it)"
            else:
                own = f" of its {len(mine)}; {len(set(mine) - set(log.started))} never started"
        where = f"in {log.interrupted}" if log.interrupted else "between tests"
        how = log.how_it_ended().split(" ", 1)
        print(f"{label}: {how[0].upper()} {how[1]} {where} after {len(log.started)} tests{own} ({counts})")
    started = set()
    for log in logs:
        started.update(log.started)
    unreached = [n for n in names if n not in started]
    if args.unreached:
        with open(args.unreached, "w") as f:
            f.writelines(n + "\n" for n in unreached)
    print(f"{len(names)} tests listed, {len(names) - len(unreached)} started, {len(unreached)} never started"
          + (": " + ", ".join(unreached[:8]) + (" ..." if len(unreached) > 8 else "") if unreached else ""))
    return 0


def gtest(args):
    logs = [GtestLog(p) for p in args.logs]
    merged = {}  # name -> (outcome, message, log); a test that ran twice keeps its worse outcome
    worse = {"passed": 0, "skipped": 1, "failed": 2, "interrupted": 3}
    for log in logs:
        for name, (outcome, message) in log.tests.items():
            if name not in merged or worse[outcome] > worse[merged[name][0]]:
                merged[name] = (outcome, message, log)
    failed = sorted(n for n, (o, _, _) in merged.items() if o == "failed")
    skips = {n: m for n, (o, m, _) in merged.items() if o == "skipped"}
    unexplained = []
    for name, message in sorted(skips.items()):
        need_gpus = re.search(r"needs (\d+) (?:GPUs|CUDA devices)", message)
        need_gib = re.search(r"needs (\d+) GiB", message)
        if args.allow_skips:
            continue
        if need_gpus and int(need_gpus.group(1)) > args.gpus:
            continue
        if need_gib and int(need_gib.group(1)) > args.free_gib:
            continue
        unexplained.append(f"{name} ({message[:160]})")
    n_passed = sum(1 for o, _, _ in merged.values() if o == "passed")
    line = f"{n_passed} passed, {len(failed)} failed, {len(skips)} skipped"
    problems = []
    stuck = [log for log in logs if log.interrupted]
    if stuck:
        line += f", {len(stuck)} crashed or hung"
    if failed:
        problems.append("failed: " + ", ".join(failed[:20]) + (f" and {len(failed) - 20} more" if len(failed) > 20 else ""))
    for log in stuck:
        problems.append(f"did not finish: {log.how_it_ended()} in {log.interrupted} ({log.name})")
    for log in logs:
        if not log.interrupted and not log.finished:
            problems.append(f"did not finish: {log.how_it_ended()} with no test running ({log.name}: no GoogleTest summary)")
        elif log.finished and log.exit is not None and (log.exit != 1 or not log.count("failed")):
            problems.append(f"{log.name} ran its tests but exited {log.exit}")
    if args.list:
        started = set(merged)
        never = [n for n in read_test_list(args.list) if n not in started]
        if never:
            problems.append(f"{len(never)} listed tests never ran: " + ", ".join(never[:8]) + (" ..." if len(never) > 8 else ""))
    if unexplained:
        more = f"; and {len(unexplained) - 6} more (the log has them all)" if len(unexplained) > 6 else ""
        problems.append(f"skipped on a machine with {args.gpus} GPU(s): " + "; ".join(unexplained[:6]) + more)
    if len(skips) > len(unexplained) and not args.allow_skips:
        line += f" ({len(skips) - len(unexplained)} need more GPUs or memory than this machine has)"
    print(line + ("; " + "; ".join(problems) if problems else ""))
    return 1 if problems else 0


# ---- track and falls ------------------------------------------------------------------------------------


def losses(path):
    out = {}
    for line in open(path):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "step":
            out[event["step"]] = event["loss"]
    return out


# How far train_vit's loss on the GPU may lie from its CPU twin, relative, at step 1 and by step K.
# The twin rounds every tensor to bf16 (or FP8) exactly where the GPU does and accumulates in f32;
# only the order of the f32 sums differs. That changes an f32 result by a few f32 ulps, and so the
# rounded bf16 value by one bf16 ulp (2^-8 relative) in the few elements whose f32 value lies that
# close to a rounding boundary; an E4M3 value has 3 mantissa bits, so there the flip is 2^-3 (and a
# scale computed from an amax one ulp apart moves every element a little). The loss averages over
# the batch, so at step 1 it moves by far less than one ulp of its inputs: 2^-7 (bf16) and 2^-5
# (fp8) leave a wide margin. The runs then diverge slowly as the weights drift apart: by step K the
# bounds double. A wrong transpose, scale, reduction or gradient moves the loss by O(1) within a
# step or two, far outside both.
BOUNDS = {"bf16": (2**-7, 2**-6), "fp8": (2**-5, 2**-4), "f32": (2**-12, 2**-10),
          # two GPU runs that must agree bit for bit on the CPU (--fp8-all-gather against bf16
          # gathers): only non-deterministic GPU kernels (atomics in attention's backward) separate them
          "same-gpu": (2**-7, 2**-7)}


def track(args):
    gpu, ref = losses(args.gpu), losses(args.reference)
    first, last = BOUNDS[args.precision]
    worst, worst_step, rows = 0.0, None, []
    for step in range(1, args.steps + 1):
        if step not in gpu or step not in ref:
            print(f"step {step} missing ({len(gpu)} GPU steps, {len(ref)} reference steps)")
            return 1
        rel = abs(gpu[step] - ref[step]) / abs(ref[step])
        bound = first + (last - first) * (step - 1) / max(args.steps - 1, 1)
        rows.append((step, gpu[step], ref[step], rel, bound))
        if rel > worst:
            worst, worst_step = rel, step
    bad = [r for r in rows if not r[3] <= r[4]]
    detail = ", ".join(f"{s}: {g:.5f} vs {c:.5f}" for s, g, c, _, _ in rows[:3])
    print(f"steps 1-{args.steps}: largest relative difference {worst:.2e} (step {worst_step}); bound "
          f"{first:.1e} at step 1 rising to {last:.1e}; bit for bit: {all(g == c for _, g, c, _, _ in rows)}; {detail}" +
          ("; OUT OF BOUND at " + ", ".join(f"step {s} ({r:.2e} > {b:.2e})" for s, _, _, r, b in bad) if bad else ""))
    return 1 if bad else 0


def falls(args):
    steps = losses(args.run)
    if len(steps) < 10:
        print(f"only {len(steps)} steps logged")
        return 1
    values = [steps[s] for s in sorted(steps)]
    start, end = sum(values[:5]) / 5, sum(values[-5:]) / 5
    ok = end <= 0.85 * start
    print(f"mean loss of the first 5 steps {start:.4f}, of the last 5 {end:.4f} ({len(values)} steps)"
          + ("" if ok else "; it did not fall below 0.85 of the start"))
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("gtest")
    p.add_argument("logs", nargs="+")
    p.add_argument("--list", help="the suite's --gtest_list_tests output: every test in it must have run")
    p.add_argument("--gpus", type=int, default=0)
    p.add_argument("--free-gib", type=int, default=0)
    p.add_argument("--allow-skips", action="store_true")
    p = sub.add_parser("shards")
    p.add_argument("list")
    p.add_argument("logs", nargs="+")
    p.add_argument("--unreached", help="write the tests of the list that no log started here, one per line")
    p = sub.add_parser("track")
    p.add_argument("gpu")
    p.add_argument("reference")
    p.add_argument("--precision", choices=sorted(BOUNDS), required=True)
    p.add_argument("--steps", type=int, required=True)
    p = sub.add_parser("falls")
    p.add_argument("run")
    p = sub.add_parser("kernels")
    p.add_argument("csv", nargs="+")
    p.add_argument("--top", type=int, default=15)
    p = sub.add_parser("metrics")
    p.add_argument("csv")
    p = sub.add_parser("choose")
    p.add_argument("bench")
    p.add_argument("--kernels", help="bench_kernels' output (its JSON rows are read)")
    p = sub.add_parser("table")
    p.add_argument("bench")
    p.add_argument("--device", default="")
    p.add_argument("--model", default="")
    p.add_argument("--batch", default="")
    p.add_argument("--commit", default="")
    p.add_argument("--date", default="")
    args = parser.parse_args()
    return {"gtest": gtest, "shards": shards, "track": track, "falls": falls, "kernels": kernels,
            "metrics": metrics, "choose": choose, "table": table}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
