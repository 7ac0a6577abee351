#!/usr/bin/env python3
"""The benchmark side of tools/gpu_check_report.py: its subcommands kernels, metrics, choose and
table (that file's docstring says what each does). Standard library only."""
import csv
import datetime
import gzip
import io
import json
import os
import re

# ---- kernels ----------------------------------------------------------------------------------------------

# Kernel categories, tried in this order against the kernel's name (its template arguments included,
# so that an FP8 cast that also applies GELU counts as GELU, as the fused producers are meant to).
CATEGORIES = [
    ("attention", r"sdpa|fmha|flash|attention|compute_dot_do_o|convert_dq_to_16bits|softmax"),
    ("GEMM", r"gemm|cutlass|xmma|nvjet|cublas|splitk"),
    ("LayerNorm", r"layer_?norm"),
    ("GELU", r"gelu"),
    ("FP8 cast/amax", r"fp8|amax|e4m3|e5m2|update_scales"),
    ("optimizer", r"sgd|adam|optim|multi_tensor|clip_scalars|scale_chunks"),
    ("loss", r"cross_entropy|nll_loss"),
    ("copies/converts/fills", r"copy|convert|fill|gather|scatter|transpose|place_band|memset|memcpy|nchwtonhwc|nhwctonchw"),
    ("elementwise", r"binary|unary|elementwise|map_kernel|axpy|dropout|keep_mask"),
    ("reductions", r"reduce|partials|max_rows|max_cols|sum"),
]
UNITS_NS = {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "µs": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}


def kernel_label(name):
    """The kernel's name without 'void ', its parameter list and '<unnamed>::' (its template
    arguments stay: they tell GeluForward from GeluBackward). ncu's sections print the anonymous
    namespace of kernels:: as 'unnamed>::' (the 2026-11-28 run), its metrics as '<unnamed>::'."""
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    name = re.sub(r"(?<=\w)<unnamed>::", "<", name)  # a template's first argument: keep its '<'
    return re.sub(r"<?unnamed>::|\(anonymous namespace\)::", "", name)


def category(label):
    for name, pattern in CATEGORIES:
        if re.search(pattern, label, re.I):
            return name
    return "other"


def read_ncu_rows(path):
    """The header, the units row and the data rows of ncu's --csv --page raw output."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", errors="replace") as f:
        lines = f.read().splitlines()
    header = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if header is None:
        return [], [], []
    rows = list(csv.reader(io.StringIO("\n".join(line for line in lines[header:] if line.startswith('"')))))
    columns, body = rows[0], rows[1:]
    units = []
    if body and not body[0][0]:
        units, body = body[0], body[1:]
    return columns, units, body


def read_ncu_csv(path):
    """(kernel label, nanoseconds) per launch from ncu's --csv --page raw output. The program's own
    output and ncu's ==PROF== lines come before the CSV; the row after the header gives the units."""
    columns, units, body = read_ncu_rows(path)
    if "Kernel Name" not in columns or "gpu__time_duration.sum" not in columns:
        return []
    name_at, time_at = columns.index("Kernel Name"), columns.index("gpu__time_duration.sum")
    scale = UNITS_NS.get(units[time_at].strip(), 1.0) if time_at < len(units) else 1.0
    out = []
    for row in body:
        if len(row) <= max(name_at, time_at):
            continue
        try:
            ns = float(row[time_at].replace(",", "")) * scale
        except ValueError:
            continue
        out.append((kernel_label(row[name_at]), ns))
    return out


def kernels(args):
    status = 0
    by_file = []
    for path in args.csv:
        launches = read_ncu_csv(path)
        name = os.path.basename(path)
        if not launches:
            print(f"{name}: no kernels (not an ncu --csv --page raw capture with gpu__time_duration.sum, or the capture failed)\n")
            status = 1
            continue
        total = sum(ns for _, ns in launches)
        per_kernel, per_category = {}, {}
        for label, ns in launches:
            t, n = per_kernel.get(label, (0.0, 0))
            per_kernel[label] = (t + ns, n + 1)
            c = category(label)
            t, n = per_category.get(c, (0.0, 0))
            per_category[c] = (t + ns, n + 1)
        by_file.append((name, total, per_category))
        print(f"{name}: {len(launches)} kernel launches, {total / 1e6:.2f} ms of GPU time (ncu runs them one at a time)")
        print(f"  {'category':<24}{'ms':>9}{'share':>8}{'launches':>10}")
        for c, (ns, n) in sorted(per_category.items(), key=lambda kv: -kv[1][0]):
            print(f"  {c:<24}{ns / 1e6:>9.2f}{100 * ns / total:>7.1f}%{n:>10}")
        print(f"  top {args.top} kernels by time:")
        print(f"  {'ms':>9}{'launches':>10}{'us/launch':>11}  {'category':<22}kernel")
        for label, (ns, n) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:args.top]:
            shown = label if len(label) <= 140 else label[:137] + "..."
            print(f"  {ns / 1e6:>9.2f}{n:>10}{ns / n / 1e3:>11.1f}  {category(label):<22}{shown}")
        print()
    if len(by_file) > 1:
        cats = [c for c, _ in CATEGORIES] + ["other"]
        cats = [c for c in cats if any(c in pc for _, _, pc in by_file)]
        print("| ms per captured step | " + " | ".join(n for n, _, _ in by_file) + " |")
        print("|---|" + "---:|" * len(by_file))
        for c in cats:
            print(f"| {c} | " + " | ".join(f"{pc[c][0] / 1e6:.2f}" if c in pc else "–" for _, _, pc in by_file) + " |")
        print("| sum | " + " | ".join(f"{t / 1e6:.2f}" for _, t, _ in by_file) + " |")
    return status


# ---- metrics: why a kernel is slow ----------------------------------------------------------------------------

# The columns of an ncu capture with the SpeedOfLight, LaunchStats, Occupancy, WarpStateStats and
# MemoryWorkloadAnalysis sections that say where a memory-bound kernel's time goes, with the unit
# each is printed in (a column the capture lacks prints as n/a).
METRICS = [
    ("µs", ("gpu__time_duration.sum",), "us"),
    ("DRAM read MB", ("dram__bytes_read.sum",), "MB"),
    ("DRAM write MB", ("dram__bytes_write.sum",), "MB"),
    # The sections alone give DRAM bytes only as a rate (the 2026-11-28 run): rate x time.
    ("DRAM MB", ("dram__bytes.sum.per_second",), "MB over the kernel's time"),
    ("DRAM % of peak", ("dram__throughput.avg.pct_of_peak_sustained_elapsed",
                        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"), ""),
    ("SM % of peak", ("sm__throughput.avg.pct_of_peak_sustained_elapsed",), ""),
    ("occupancy %", ("sm__warps_active.avg.pct_of_peak_sustained_active",), ""),
    ("theoretical %", ("sm__maximum_warps_per_active_cycle_pct",), ""),
    ("waves per SM", ("launch__waves_per_multiprocessor",), ""),
    ("grid", ("launch__grid_size",), ""),
    ("block", ("launch__block_size",), ""),
    ("registers", ("launch__registers_per_thread",), ""),
    ("instructions (M)", ("smsp__inst_executed.sum", "inst_executed"), "M"),
]
UNITS_BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
# ncu spells a rate's seconds either way, by version ("Tbyte/s" in the 2026-11-28 capture).
UNITS_RATE = {f"{prefix}byte/{seconds}": scale for prefix, scale in (("", 1), ("K", 1e3), ("M", 1e6), ("G", 1e9),
                                                                      ("T", 1e12)) for seconds in ("s", "second")}
STALL = re.compile(r"^smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)_per_issue_active\.ratio$")


def cell_number(row, at):
    try:
        return float(row[at].replace(",", ""))
    except (ValueError, IndexError):
        return None


def metric_value(row, columns, units, names, unit):
    """The first of `names` the capture has, in `unit`; None when it has none of them."""
    for name in names:
        if name not in columns:
            continue
        at = columns.index(name)
        v = cell_number(row, at)
        if v is None:
            return None
        u = units[at].strip() if at < len(units) else ""
        if unit == "us":
            return v * UNITS_NS.get(u, 1.0) / 1e3
        if unit == "MB":
            return v * UNITS_BYTES.get(u, 1.0) / 1e6
        if unit == "MB over the kernel's time":
            seconds = metric_value(row, columns, units, ("gpu__time_duration.sum",), "us")
            if seconds is None or u not in UNITS_RATE:  # a unit it does not know: n/a, not a wrong number
                return None
            return v * UNITS_RATE[u] * seconds * 1e-6 / 1e6
        if unit == "M":
            return v / 1e6
        return v
    return None


def metrics(args):
    """One line per profiled kernel: its time, the DRAM bytes it really moved, how full the SMs were,
    how many waves its grid made, and the three reasons its warps stalled most (cycles between two
    issues, per issued instruction)."""
    columns, units, body = read_ncu_rows(args.csv)
    if not body or "Kernel Name" not in columns:
        print(f"{os.path.basename(args.csv)}: no kernels (not an ncu --csv --page raw capture, or the capture failed)")
        return 1
    name_at = columns.index("Kernel Name")
    stalls = [(m.group(1), i) for i, c in enumerate(columns) if (m := STALL.match(c))]
    print("| kernel | " + " | ".join(label for label, _, _ in METRICS) + " | most stalled on |")
    print("|---|" + "---:|" * len(METRICS) + "---|")
    for row in body:
        if len(row) <= name_at:
            continue
        label = re.sub(r"\b\w+::", "", kernel_label(row[name_at]))  # namespaces off, template arguments kept
        label = label if len(label) <= 90 else label[:87] + "..."
        cells = []
        for _, names, unit in METRICS:
            v = metric_value(row, columns, units, names, unit)
            cells.append("n/a" if v is None else (f"{v:.1f}" if abs(v) < 1e4 else f"{v:.0f}"))
        ranked = [(v, reason) for reason, at in stalls if (v := cell_number(row, at)) is not None]
        ranked.sort(reverse=True)
        top = ", ".join(f"{r} {v:.1f}" for v, r in ranked[:3]) if ranked else "n/a"
        print(f"| {label} | " + " | ".join(cells) + f" | {top} |")
    return 0


# ---- choose: the trials' winners ------------------------------------------------------------------------

def read_json_lines(path, bench=None):
    rows = []
    for line in open(path):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and (bench is None or r.get("bench") == bench):
            rows.append(r)
    return rows


# The bench_kernels rows the bias gradients' design is judged by: (kernel, variant) -> its median µs.
# The bias gradients the two designs differ on are qkv's (one a block) and proj's and fc2's (two a
# block, both over 1280 columns of 12,608 rows: proj's row stands for both).
# What a trial judged by the step's images/s must gain: two bench_vit runs of one configuration differ
# by up to about 1% (the runs of one check), so a smaller gain is not told from noise. The kernel
# rows (medians of 30 timed launches) need no margin.
# (The fourth GPU run, 2026-11-29, settled the other trials that stood here: LayerNorm's backward in
# columns and the row kernels' refill lost and are gone, and the column sum became the default.)
STEP_MARGIN = 0.01
BIAS_GRAD_ROWS = (("linear_backward (qkv wgrad)", 1), ("linear_backward (proj wgrad)", 2))
BIAS_GRAD_VARIANTS = {"epilogue": "bf16, BGRADB epilogue", "column-sum": "bf16, GEMM then column sum"}


def choose(args):
    """Which of bench_vit's options on trial beat the library's defaults in this check's runs, so that
    the check can time the step with all the winners together (tools/gpu_check.sh, stage chosen)."""
    runs = {}
    for r in read_json_lines(args.bench):
        if r.get("run"):
            runs[r["run"]] = r
    us = {}
    if args.kernels and os.path.exists(args.kernels):
        for r in read_json_lines(args.kernels, bench="bench_kernels"):
            if "us" in r and "variant" in r:
                us[(r["kernel"], r["variant"])] = r["us"]
    flags = {"bf16": [], "fp8": []}
    why = []

    def by_step(precision, base, trial, flag):
        if base not in runs or trial not in runs:
            why.append(f"{precision} {flag}: not decided, {'the run with it' if base in runs else 'the run without it'} "
                       "did not run; the default stays")
            return False
        with_it, without = runs[trial]["images_per_s"], runs[base]["images_per_s"]
        won = with_it > without * (1 + STEP_MARGIN)
        verdict = ("taken" if won else f"the default stays (less than the step's {STEP_MARGIN:.0%} spread)"
                   if with_it > without else "the default stays")
        why.append(f"{precision} {flag}: {with_it:.1f} images/s with it, {without:.1f} without: {verdict}")
        return won

    for precision, base in (("bf16", "octet"), ("fp8", "octet-fp8")):
        if by_step(precision, base, base + "-autotune", "--autotune on"):
            flags[precision] += ["--autotune", "on"]

    # --bias-grad epilogue (bf16: the FP8 step's bias gradients come out of its casts), by the kernel rows.
    cost = {}
    for design, variant in BIAS_GRAD_VARIANTS.items():
        parts = [(us.get((kernel, variant)), n) for kernel, n in BIAS_GRAD_ROWS]
        cost[design] = None if any(t is None for t, _ in parts) else sum(t * n for t, n in parts)
    if cost["epilogue"] is None or cost["column-sum"] is None:
        why.append("bf16 --bias-grad epilogue: not decided, bench_kernels has no qkv and proj wgrad rows for "
                   "both designs; the default stays")
    else:
        won = cost["epilogue"] < cost["column-sum"]
        why.append(f"bf16 --bias-grad epilogue: a block's qkv, proj and fc2 weight gradients "
                   f"{cost['epilogue']:.1f} µs with BGRADB, {cost['column-sum']:.1f} with the column sum: "
                   + ("taken" if won else "the default stays"))
        if won:
            flags["bf16"] += ["--bias-grad", "epilogue"]

    for precision in ("bf16", "fp8"):
        print(f"{precision}: {' '.join(flags[precision])}".rstrip())
    for line in why:
        print(f"why: {line}")
    return 0


# ---- table ------------------------------------------------------------------------------------------------

# The rows, keyed by the JSON line's "run" (tools/gpu_check.sh tags bench_vit's lines with it: the
# line alone does not say whether the fused FP8 producers were on) or else its "bench".
NAMES = {
    "octet": "Octet bf16 (bench_vit)",
    "octet-head-start": "Octet bf16, --head-start 30 (the host 30 ms ahead of the GPU)",
    "octet-fp8": "Octet fp8, delayed scaling, fused producers on (bench_vit)",
    "octet-fp8-unfused": "Octet fp8, delayed scaling, --fp8-fused-producers off",
    "octet-recompute": "Octet bf16, --recompute blocks",
    "octet-gelu-tanh": "Octet bf16, --gelu tanh (the GELU in cuBLASLt's GEMM epilogues)",
    "octet-autotune": "Octet bf16, --autotune on",
    "octet-fp8-autotune": "Octet fp8, fused producers on, --autotune on",
    "octet-bias-epilogue": "Octet bf16, --bias-grad epilogue (cuBLASLt's BGRADB)",
    "octet-chosen": "Octet bf16, the trials' winners together (choose)",
    "octet-fp8-chosen": "Octet fp8, fused producers on, the trials' winners together (choose)",
    "pytorch-eager": "PyTorch eager, bf16 autocast, SGD",
    "pytorch-eager-fused": "PyTorch eager, bf16 autocast, SGD(fused=True)",
    "pytorch-compile": "PyTorch torch.compile, bf16 autocast, SGD",
    "pytorch-compile-fused": "PyTorch torch.compile, bf16 autocast, SGD(fused=True)",
    "pytorch-eager-gelu-tanh": "PyTorch eager, bf16 autocast, SGD, nn.GELU(approximate='tanh')",
}


def goal(text, value, target, at_least=True, fmt=".3f", unit=""):
    met = value >= target if at_least else value <= target
    return (f"{text} = {value:{fmt}}{unit} (goal {'>=' if at_least else '<='} {target}{unit}): "
            + ("met" if met else "NOT met"))


def table(args):
    runs = {}
    for line in open(args.bench):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        key = r.get("run") or r["bench"] + ("-fp8" if r.get("precision") == "fp8" else "")
        runs[key] = r
    ips = {k: r["images_per_s"] for k, r in runs.items()}
    eager, compiled = ips.get("pytorch-eager"), ips.get("pytorch-compile")
    fmt = lambda v, f: "n/a" if v is None else format(v, f)
    date = args.date or datetime.date.today().isoformat()
    steps = runs.get("octet", {}).get("steps")
    print(f"{date}, {args.device}" + (f", commit {args.commit}" if args.commit else "") + ". "
          f"{args.model}, batch {args.batch}, SGD momentum 0.9, synthetic data on the GPU"
          + (f", median step of {steps} after the warm-up steps" if steps else "") + ":")
    print()
    print("| run | images/s | step ms | TFLOP/s | MFU | peak memory GiB | ÷ PyTorch eager | ÷ torch.compile |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for key, name in NAMES.items():
        r = runs.get(key)
        if r is None:
            print(f"| {name} | did not run | | | | | | |")
            continue
        mfu = None if r.get("mfu") is None else 100 * r["mfu"]
        print(f"| {name} | {r['images_per_s']:.1f} | {r['step_ms']:.1f} | {r['tflops']:.1f} | "
              f"{'n/a' if mfu is None else format(mfu, '.1f') + '%'} | "
              f"{fmt(r.get('peak_memory_gib'), '.1f')} | {fmt(eager and r['images_per_s'] / eager, '.3f')} | "
              f"{fmt(compiled and r['images_per_s'] / compiled, '.3f')} |")
    print()
    goals = []
    if "octet" in runs:
        bf16 = runs["octet"]
        if eager:
            goals.append(goal("Octet bf16 ÷ PyTorch eager", ips["octet"] / eager, 1.3))
        if compiled:
            goals.append(goal("Octet bf16 ÷ torch.compile", ips["octet"] / compiled, 1.15))
        if bf16.get("mfu") is not None:
            mfu = 100 * bf16["mfu"]
            goals.append(goal("Octet bf16 MFU", mfu, 50, fmt=".1f", unit="%") + f" (stretch 55%: {'met' if mfu >= 55 else 'not met'})")
        if "octet-fp8" in runs:
            goals.append(goal("Octet fp8 ÷ Octet bf16", ips["octet-fp8"] / ips["octet"], 1.35))
        peak, eager_peak = bf16.get("peak_memory_gib"), runs.get("pytorch-eager", {}).get("peak_memory_gib")
        if peak and eager_peak:
            goals.append(goal("Octet bf16 peak memory ÷ PyTorch eager's", peak / eager_peak, 0.8, at_least=False))
    if "octet-fp8" in runs:
        if eager:
            goals.append(goal("Octet fp8 ÷ PyTorch eager bf16", ips["octet-fp8"] / eager, 1.9))
        if "octet-fp8-unfused" in runs:
            ratio = ips["octet-fp8"] / ips["octet-fp8-unfused"]
            goals.append(f"Octet fp8 with the fused producers ÷ with the separate casts = {ratio:.3f} (goal > 1): "
                         + ("met" if ratio > 1 else "NOT met"))
    if "octet-recompute" in runs and "octet" in runs:
        r = runs["octet-recompute"]
        goals.append(f"bf16 --recompute blocks: {ips['octet-recompute'] / ips['octet']:.3f}x bf16's images/s, "
                     f"peak memory {fmt(r.get('peak_memory_gib'), '.2f')} GiB against {fmt(runs['octet'].get('peak_memory_gib'), '.2f')}")
    if "octet-gelu-tanh" in runs and "octet" in runs:
        tanh = ips["octet-gelu-tanh"]
        goals.append(f"bf16 --gelu tanh: {tanh / ips['octet']:.3f}x bf16's (erf) images/s"
                     + (f", {tanh / ips['pytorch-eager-gelu-tanh']:.3f}x PyTorch eager with the same GELU"
                        if "pytorch-eager-gelu-tanh" in runs else ""))
    if "octet-head-start" in runs and "octet" in runs:
        held, plain = runs["octet-head-start"], runs["octet"]
        goals.append(f"bf16 with each step held {held.get('head_start_ms', 0):g} ms while the host queues it "
                     f"(--head-start): step {held['step_ms']:.2f} ms against {plain['step_ms']:.2f}, "
                     f"{plain['step_ms'] - held['step_ms']:+.2f} ms: the plain run's wait on the host's launches, "
                     "up to the run-to-run spread")
    # The runs with bench_vit's own options beside the library's defaults (--autotune; the kernel design
    # on trial, which a GPU run would make the default): (bf16 run, fp8 run, the goals' words for them,
    # the line comparing each with its base run).
    variants = (
        ("octet-autotune", "octet-fp8-autotune", "--autotune on",
         "{what} --autotune on: {ratio:.3f}x {what}'s images/s with the libraries' heuristic choices"),
        ("octet-bias-epilogue", None, "--bias-grad epilogue",
         "{what} --bias-grad epilogue: {ratio:.3f}x {what}'s images/s with the column sum"),
    )
    for bf16_run, fp8_run, _, compared in variants:
        for run, base, what in ((bf16_run, "octet", "bf16"), (fp8_run, "octet-fp8", "fp8")):
            if run in runs and base in runs:
                goals.append(compared.format(what=what, ratio=ips[run] / ips[base]))
    # The issue's goals again for each of them.
    for bf16_run, fp8_run, words, _ in variants:
        if bf16_run in runs:
            if compiled:
                goals.append(goal(f"Octet bf16 {words} ÷ torch.compile", ips[bf16_run] / compiled, 1.15))
            if runs[bf16_run].get("mfu") is not None:
                goals.append(goal(f"Octet bf16 {words} MFU", 100 * runs[bf16_run]["mfu"], 50, fmt=".1f", unit="%"))
        if fp8_run in runs and eager:
            goals.append(goal(f"Octet fp8 {words} ÷ PyTorch eager bf16", ips[fp8_run] / eager, 1.9))
    # The trials' winners together (the stage chosen): what the library would run with them as its defaults.
    for run, base, what in (("octet-chosen", "octet", "bf16"), ("octet-fp8-chosen", "octet-fp8", "fp8")):
        if run not in runs:
            continue
        flags = re.sub(r"--precision \S+\s*", "", runs[run].get("flags", "?")).strip()
        words = f"{what} with the trials' winners ({flags})"
        if base in runs:
            goals.append(f"{words}: {ips[run] / ips[base]:.3f}x {what}'s images/s with the library's defaults")
        if what == "bf16":
            if compiled:
                goals.append(goal(f"Octet {words} ÷ torch.compile", ips[run] / compiled, 1.15))
            if runs[run].get("mfu") is not None:
                goals.append(goal(f"Octet {words} MFU", 100 * runs[run]["mfu"], 50, fmt=".1f", unit="%"))
        else:
            if eager:
                goals.append(goal(f"Octet {words} ÷ PyTorch eager bf16", ips[run] / eager, 1.9))
            bf16_best = max((ips[k] for k in ("octet", "octet-chosen") if k in runs), default=None)
            if bf16_best:
                goals.append(goal(f"Octet {words} ÷ Octet bf16's faster run", ips[run] / bf16_best, 1.35))
    if "octet" in runs and "pytorch-eager" in runs:
        goals.append(f"GFLOP per training image: Octet {runs['octet']['gflop_per_image']:.1f}, "
                     f"PyTorch script {runs['pytorch-eager']['gflop_per_image']:.1f}")
    for g in goals:
        print(f"- {g}")
    missing = [k for k in NAMES if k not in runs]
    if missing:
        print()
        print("did not run: " + ", ".join(missing))
    return 0
