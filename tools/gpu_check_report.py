#!/usr/bin/env python3
"""The verdicts of tools/gpu_check.sh, each a subcommand that prints one line and exits 1 on failure.

  gtest LOG [--gpus N] [--free-gib G] [--allow-skips]
        a GoogleTest log: every test passed, and none skipped unless it needs more GPUs or more free
        device memory than this machine has (its skip message says 'needs N GPUs', 'needs N CUDA devices' or 'needs N GiB')
  track GPU.jsonl CPU.jsonl --precision bf16|fp8|same-gpu --steps K
        train_vit's losses on the GPU follow its CPU twin (or another GPU run) over the first K steps
  falls RUN.jsonl
        the loss falls: the mean of the last 5 steps is at most 0.85 of the first 5
  table BENCH.jsonl --device TEXT --model NAME --batch N
        the benchmark table: Octet bf16 and fp8 beside PyTorch eager and torch.compile

Standard library only: it runs on a GPU machine beside PyTorch and here alike.
"""
import argparse
import datetime
import json
import re
import sys

# ---- gtest -----------------------------------------------------------------------------------------------


def gtest(args):
    text = open(args.log, errors="replace").read()
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    failed = sorted(set(re.findall(r"^\[  FAILED  \] (\S+\.\S+)", text, re.M)))
    passed = re.search(r"^\[  PASSED  \] (\d+) tests?", text, re.M)
    # Each skipped test's message: the lines between its RUN and SKIPPED lines.
    skips = {}
    for m in re.finditer(r"^\[ RUN      \] (\S+)\n(.*?)^\[  SKIPPED \] \1", text, re.M | re.S):
        skips[m.group(1)] = " ".join(line.strip() for line in m.group(2).splitlines() if line.strip())
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
    n_passed = int(passed.group(1)) if passed else 0
    line = f"{n_passed} passed, {len(failed)} failed, {len(skips)} skipped"
    problems = []
    if failed:
        problems.append("failed: " + ", ".join(failed[:20]) + (f" and {len(failed) - 20} more" if len(failed) > 20 else ""))
    if unexplained:
        more = f"; and {len(unexplained) - 6} more (the log has them all)" if len(unexplained) > 6 else ""
        problems.append(f"skipped on a machine with {args.gpus} GPU(s): " + "; ".join(unexplained[:6]) + more)
    if not passed and not failed:
        problems.append("no GoogleTest summary in the log (the program did not finish)")
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


# ---- table ------------------------------------------------------------------------------------------------

NAMES = {
    "octet": "Octet bf16 (bench_vit)",
    "octet-fp8": "Octet fp8, delayed scaling (bench_vit)",
    "pytorch-eager": "PyTorch eager, bf16 autocast, SGD",
    "pytorch-eager-fused": "PyTorch eager, bf16 autocast, SGD(fused=True)",
    "pytorch-compile": "PyTorch torch.compile, bf16 autocast, SGD",
    "pytorch-compile-fused": "PyTorch torch.compile, bf16 autocast, SGD(fused=True)",
}


def table(args):
    runs = {}
    for line in open(args.bench):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        key = r["bench"] + ("-fp8" if r.get("precision") == "fp8" else "")
        runs[key] = r
    ips = {k: r["images_per_s"] for k, r in runs.items()}
    eager, compiled = ips.get("pytorch-eager"), ips.get("pytorch-compile")
    fmt = lambda v, f: "n/a" if v is None else format(v, f)
    print(f"{args.model}, batch {args.batch}, SGD momentum 0.9, synthetic data on the GPU; "
          f"{args.device}; {datetime.date.today().isoformat()}")
    print()
    print("| run | images/s | step ms | TFLOP/s | MFU | peak memory GiB | ÷ PyTorch eager | ÷ torch.compile |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for key, name in NAMES.items():
        r = runs.get(key)
        if r is None:
            print(f"| {name} | did not run | | | | | | |")
            continue
        mfu = None if r.get("mfu") is None else 100 * r["mfu"]
        print(f"| {name} | {r['images_per_s']:.1f} | {r['step_ms']:.1f} | {r['tflops']:.1f} | {fmt(mfu, '.1f')}% | "
              f"{fmt(r.get('peak_memory_gib'), '.1f')} | {fmt(eager and r['images_per_s'] / eager, '.3f')} | "
              f"{fmt(compiled and r['images_per_s'] / compiled, '.3f')} |")
    print()
    goals = []
    if "octet" in runs:
        bf16 = runs["octet"]
        if eager:
            goals.append(f"Octet bf16 ÷ PyTorch eager = {ips['octet'] / eager:.3f} (goal >= 1.3)")
        if compiled:
            goals.append(f"Octet bf16 ÷ torch.compile = {ips['octet'] / compiled:.3f} (goal >= 1.1)")
        if bf16.get("mfu") is not None:
            goals.append(f"Octet bf16 MFU = {100 * bf16['mfu']:.1f}% (goal >= 55%)")
        if "octet-fp8" in runs:
            goals.append(f"Octet fp8 ÷ Octet bf16 = {ips['octet-fp8'] / ips['octet']:.3f} (goal >= 1.35)")
        peak, eager_peak = bf16.get("peak_memory_gib"), runs.get("pytorch-eager", {}).get("peak_memory_gib")
        if peak and eager_peak:
            goals.append(f"Octet bf16 peak memory ÷ PyTorch eager's = {peak / eager_peak:.3f} (goal <= 0.8)")
        if "pytorch-eager" in runs:
            goals.append(f"GFLOP per training image: Octet {bf16['gflop_per_image']:.1f}, "
                         f"PyTorch script {runs['pytorch-eager']['gflop_per_image']:.1f}")
    for g in goals:
        print(g)
    missing = [k for k in ("octet", "octet-fp8", "pytorch-eager", "pytorch-compile") if k not in runs]
    if missing:
        print("did not run: " + ", ".join(missing))
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("gtest")
    p.add_argument("log")
    p.add_argument("--gpus", type=int, default=0)
    p.add_argument("--free-gib", type=int, default=0)
    p.add_argument("--allow-skips", action="store_true")
    p = sub.add_parser("track")
    p.add_argument("gpu")
    p.add_argument("reference")
    p.add_argument("--precision", choices=sorted(BOUNDS), required=True)
    p.add_argument("--steps", type=int, required=True)
    p = sub.add_parser("falls")
    p.add_argument("run")
    p = sub.add_parser("table")
    p.add_argument("bench")
    p.add_argument("--device", default="")
    p.add_argument("--model", default="")
    p.add_argument("--batch", default="")
    args = parser.parse_args()
    return {"gtest": gtest, "track": track, "falls": falls, "table": table}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
