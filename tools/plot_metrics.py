#!/usr/bin/env python3
"""Pictures of train_vit runs, from the JSON Lines file each writes with --metrics.

    python3 tools/plot_metrics.py RUN.jsonl [MORE.jsonl ...] -o run.png [--labels a b ...] [--title T]

One figure, one panel each, every run overlaid in its own colour (to compare fp32, bf16 and fp8, or
DDP and FSDP), the runs' colours named once above the panels:
  - training loss against step (each step faint, a running mean over it), with the epochs on a
    second axis when the run spans several;
  - the learning rate;
  - test accuracy at each evaluation (the last one's value in the legend);
  - images per second (a running mean over the steps);
  - memory, where the run has figures: a GPU's bytes in use and peak against step, and the memory
    ledger's bytes per rank (activations saved for backward; under FSDP the parameter, gradient
    and optimizer shards and the peak of gathered units);
  - for fp8 runs logged with --fp8-log-layer: that layer's amaxes and scales (input, weight, output
    gradient) on log axes, and its output's error against bf16 at each log step.
Panels with nothing to show are left out. Each run is labelled by --labels, or else by its file's
name and its precision; the title says what was trained unless --title replaces it.

Uses matplotlib (Debian's python3-matplotlib, which tools/setup.sh installs); nothing else outside
the standard library. When the python3 running this script has no matplotlib (pyenv, conda and
virtual environments come first on PATH and do not see Debian's packages), the script runs itself
again with the first python3 on PATH that has it; where none has, it says which package to install.
"""
import argparse
import json
import math
import os
import subprocess
import sys

INSTALL_HINT = ("install Debian's python3-matplotlib (sudo apt-get install python3-matplotlib, or bash "
                "tools/setup.sh), or pip install matplotlib into the environment of the python3 you run")
# Interpreters already tried by an earlier run of this script, so that it never runs itself in a loop.
TRIED_ENV = "OCTET_PLOT_METRICS_TRIED"


def has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def pythons_on_path():
    """Every python3 on PATH, in PATH order, each file once."""
    seen, found = set(), []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(folder or ".", "python3")
        if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
            continue
        key = os.path.realpath(candidate)
        if key not in seen:
            seen.add(key)
            found.append(candidate)
    return found


def python_with_matplotlib(exclude=()):
    """The first python3 on PATH, other than those in `exclude`, that can import matplotlib; or None."""
    skip = {os.path.realpath(p) for p in exclude}
    for candidate in pythons_on_path():
        if os.path.realpath(candidate) in skip:
            continue
        try:
            probe = subprocess.run([candidate, "-c", "import matplotlib"], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return candidate
    return None


def ensure_matplotlib():
    """Returns when this interpreter has matplotlib. Else runs this script again under the first
    python3 on PATH that has it (never returns), or exits with one line naming the package to install.
    The python3 that runs the script is probed too: the same file may see other packages when run
    without options. Each interpreter run this way is remembered in the environment and not run again,
    so the script cannot run itself in a loop."""
    if has_matplotlib():
        return
    tried = [p for p in os.environ.get(TRIED_ENV, "").split(os.pathsep) if p]
    other = python_with_matplotlib(exclude=tried)
    if other is None:
        names = ", ".join(dict.fromkeys([sys.executable] + pythons_on_path()))
        print(f"plot_metrics: no python3 here has matplotlib (tried {names}); {INSTALL_HINT}", file=sys.stderr)
        sys.exit(3)
    env = dict(os.environ, **{TRIED_ENV: os.pathsep.join(tried + [other])})
    sys.stdout.flush()
    os.execve(other, [other, os.path.abspath(__file__)] + sys.argv[1:], env)


# ---- reading ----------------------------------------------------------------------------------------------


def read_run(path):
    """The events of one metrics file: start (a dict or None), steps, evals (lists of dicts)."""
    start, steps, evals = None, [], []
    try:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    event = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"plot_metrics: {path}:{number} is not a JSON line ({e}); pass the file train_vit "
                             f"wrote with --metrics")
                kind = event.get("event")
                if kind == "start":
                    start = event
                elif kind == "step":
                    steps.append(event)
                elif kind == "eval":
                    evals.append(event)
    except OSError as e:
        sys.exit(f"plot_metrics: cannot read {path}: {e.strerror}; pass the file train_vit wrote with --metrics")
    if not steps and not evals:
        sys.exit(f"plot_metrics: {path} has no step or eval events; is it a train_vit --metrics file?")
    steps.sort(key=lambda e: e["step"])
    evals.sort(key=lambda e: e["step"])
    return {"start": start, "steps": steps, "evals": evals}


def flags_of(run):
    return (run["start"] or {}).get("flags", {})


def label_of(path, run):
    name = os.path.splitext(os.path.basename(path))[0]
    flags = flags_of(run)
    precision, parallel = flags.get("precision"), flags.get("parallel")
    extra = [p for p in (precision, parallel if parallel not in (None, "none") else None) if p and p not in name]
    return f"{name} ({', '.join(extra)})" if extra else name


def series(events, key):
    """(steps, values) of the events that have `key`, in step order."""
    points = [(e["step"], e[key]) for e in events if e.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def running_mean(values, window):
    """The mean of each value and the window - 1 before it (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def smoothing_window(n):
    """Steps in the running mean of a series of n steps: about a twentieth of it, at least 1."""
    return max(1, round(n / 20))


def steps_per_epoch(run):
    """Optimizer steps per epoch, from the first step of epoch 1; None within one epoch."""
    for e in run["steps"]:
        if e.get("epoch", 0) >= 1:
            return e["step"] - 1 if e["step"] > 1 else None
    return None


def fp8_points(run):
    return [(e["step"], e["fp8"]) for e in run["steps"] if isinstance(e.get("fp8"), dict)]


def ledger_of(run):
    """The memory ledger with the most figures (FSDP's ledger comes at the first step and at log steps)."""
    ledgers = [e["memory_ledger"] for e in run["steps"] if isinstance(e.get("memory_ledger"), dict)]
    return max(ledgers, key=len) if ledgers else {}


def gpu_memory_points(run):
    return [(e["step"], e["memory"]) for e in run["steps"] if isinstance(e.get("memory"), dict) and e["memory"]]


# What the ledger's bytes are, in the order drawn (the first that a run has are drawn).
LEDGER_BARS = (
    ("parameters_bytes", "parameter shards"),
    ("gradients_bytes", "gradient shards"),
    ("optimizer_bytes", "optimizer state"),
    ("peak_gathered_bytes", "gathered units (peak)"),
    ("fp8_weight_casts_bytes", "FP8 weight casts"),
    ("fp8_shard_casts_bytes", "FP8 shard casts"),
    ("saved_activations_bytes", "activations saved\nfor backward"),
)


def byte_unit(largest):
    for unit, size in (("GiB", 2.0 ** 30), ("MiB", 2.0 ** 20), ("KiB", 2.0 ** 10)):
        if largest >= size:
            return unit, size
    return "bytes", 1.0


def default_title(runs, labels):
    """What was trained: the model, precision and parallelism, steps and batch, from the start events."""
    starts = [r["start"] or {} for r in runs]
    models = sorted({s.get("model") for s in starts if s.get("model")})
    model = " and ".join(models) if models else "train_vit"

    def describe(run):
        flags = flags_of(run)
        parts = [flags.get("precision", "")]
        if flags.get("precision") == "fp8" and flags.get("fp8_recipe"):
            parts[0] += f" ({flags['fp8_recipe']} scaling, {flags.get('fp8_format', 'hybrid').upper()})"
        if flags.get("parallel") not in (None, "none"):
            world = flags.get("world_size", "?")
            parts.append(f"{flags['parallel']} over {world} rank{'' if world == '1' else 's'}")
        if flags.get("recompute") not in (None, "none"):
            parts.append(f"recompute {flags['recompute']}")
        return ", ".join(p for p in parts if p)

    def extent(run):
        flags = flags_of(run)
        total = (run["start"] or {}).get("total_steps") or (run["steps"][-1]["step"] if run["steps"] else None)
        world = int(flags.get("world_size", 1) or 1)
        batch = flags.get("batch_size")
        accum = int(flags.get("grad_accum", 1) or 1)
        text = f"{total} steps" if total else ""
        if batch:
            text += f" of {int(batch) * world * accum} images"
        epochs = steps_per_epoch(run)
        if total and epochs:
            text += f" ({total / epochs:.3g} epochs)"
        return text

    if len(runs) == 1:
        bits = [b for b in (describe(runs[0]), extent(runs[0])) if b]
        return f"{model}: {'; '.join(bits)}" if bits else model
    extents = {extent(r) for r in runs}
    common = f", {extents.pop()} each" if len(extents) == 1 and "" not in extents else ""
    return f"{model}: {len(runs)} runs compared{common}"


# ---- drawing ----------------------------------------------------------------------------------------------


def make_figure(runs, labels, title=None):
    """The figure of `runs` (read_run's), labelled `labels`, and its axes by panel name, in order."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {i: colours[i % len(colours)] for i in range(len(runs))}
    many = len(runs) > 1

    panels = ["loss"]
    if any(series(r["steps"], "lr")[0] for r in runs):
        panels.append("lr")
    if any(r["evals"] for r in runs):
        panels.append("accuracy")
    if any(series(r["steps"], "images_per_sec")[0] for r in runs):
        panels.append("throughput")
    if any(gpu_memory_points(r) for r in runs):
        panels.append("gpu_memory")
    # The ledger's bars where they say something: FSDP's shards, or activations that differ between
    # the runs (--recompute); one run's activations alone are in its log and metrics.
    ledgers = [ledger_of(r) for r in runs]
    if any(set(l) - {"saved_activations_bytes"} for l in ledgers) or \
            len({l.get("saved_activations_bytes") for l in ledgers}) > 1:
        panels.append("ledger")
    if any(fp8_points(r) for r in runs):
        panels += ["amax", "scale", "fp8_error"]

    columns = 2 if len(panels) > 1 else 1
    rows = (len(panels) + columns - 1) // columns
    fig = plt.figure(figsize=(6.6 * columns, 3.5 * rows + 0.9), layout="constrained")
    grid = fig.add_gridspec(rows, columns)
    # Two panels a row; an odd last one takes the whole row rather than leave a hole beside it.
    flat = [fig.add_subplot(grid[k // columns, :] if k == len(panels) - 1 and k % columns == 0
                            else grid[k // columns, k % columns]) for k in range(len(panels))]

    # Every step axis spans the same steps, so that the panels line up and a single evaluation sits
    # where it happened, not in the middle of an axis of its own.
    first = min([r["steps"][0]["step"] for r in runs if r["steps"]] + [e["step"] for r in runs for e in r["evals"]])
    last = max([r["steps"][-1]["step"] for r in runs if r["steps"]] + [e["step"] for r in runs for e in r["evals"]])
    first = 0 if first <= max(1, last // 10) else first
    pad = max(0.5, 0.02 * (last - first))
    epochs = {steps_per_epoch(r) for r in runs}
    per_epoch = epochs.pop() if len(epochs) == 1 else None

    def step_axis(ax):
        ax.set_xlim(first - pad, last + pad)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 2.5, 5, 10], min_n_ticks=3))
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)

    def epoch_axis(ax):
        """The epochs on a second axis above the steps, when every run spans several of the same length."""
        if per_epoch and last > per_epoch:
            top = ax.secondary_xaxis("top", functions=(lambda s: s / per_epoch, lambda e: e * per_epoch))
            top.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=3))
            top.set_xlabel("epoch")

    def key_legend(ax, handles, columns=None):
        """A legend of line styles under the panel, outside the data."""
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=columns or len(handles),
                  frameon=False, fontsize="small", handlelength=2.6)

    def style_key(style, text, width=1.5):
        return Line2D([], [], color="0.35" if many else colour[0], linestyle=style, linewidth=width, label=text)

    final_accuracy, mean_throughput = {}, {}  # by run: (step, %) of the last evaluation; images/s
    for panel, ax in zip(panels, flat):
        if panel == "loss":
            for i, run in enumerate(runs):
                x, y = series(run["steps"], "loss")
                window = smoothing_window(len(y))
                if window > 1:
                    ax.plot(x, y, color=colour[i], linewidth=0.8, alpha=0.35)
                    ax.plot(x, running_mean(y, window), color=colour[i], linewidth=1.8)
                else:  # a few steps: each of them, marked
                    ax.plot(x, y, color=colour[i], linewidth=1.5, marker="o", markersize=3)
            step_axis(ax)
            ax.set_ylabel("cross-entropy loss")
            n = max(len(r["steps"]) for r in runs)
            window = smoothing_window(n)
            ax.set_title("training loss" + (f" (faint: each step; bold: mean of {window})" if window > 1 else ""))
            epoch_axis(ax)
        elif panel == "lr":
            for i, run in enumerate(runs):
                ax.plot(*series(run["steps"], "lr"), color=colour[i], linewidth=1.5,
                        linestyle="-" if i == 0 else (0, (4, 2 + i)))
            step_axis(ax)
            ax.set_title("learning rate")
            ax.set_ylabel("learning rate")
            ax.set_ylim(bottom=0)
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3), useMathText=True)
        elif panel == "accuracy":
            values = []
            for i, run in enumerate(runs):
                x, y = series(run["evals"], "accuracy")
                y = [100 * v for v in y]
                values += y
                if y:
                    final_accuracy[i] = (x[-1], y[-1])
                ax.plot(x, y, color=colour[i], marker="o", markersize=5, linewidth=1.5)
            step_axis(ax)
            epoch_axis(ax)
            low, high = min(values), max(values)
            if all(len(r["evals"]) <= 1 for r in runs):
                ax.set_ylim(0, 100)  # one evaluation each: where it lies between nothing and everything
            else:
                ax.set_ylim(max(0, 5 * math.floor((low - 4) / 5)), min(100, 5 * math.ceil((high + 4) / 5)))
            ax.yaxis.set_major_formatter(PercentFormatter(decimals=0))
            ax.set_ylabel("test accuracy")
            if many:
                ax.set_title("test accuracy at each evaluation")
            else:
                s, v = final_accuracy.get(0, (None, None))
                ax.set_title(f"test accuracy: {v:.2f} % at step {s}" if s is not None else "test accuracy")
                if s is not None:
                    ax.annotate(f"{v:.2f} %", (s, v), xytext=(-6, 8), textcoords="offset points", ha="right",
                                fontsize="small", color=colour[0])
        elif panel == "throughput":
            for i, run in enumerate(runs):
                x, y = series(run["steps"], "images_per_sec")
                window = smoothing_window(len(y))
                smooth = running_mean(y, window)
                if window > 1:
                    ax.plot(x, y, color=colour[i], linewidth=0.8, alpha=0.3)
                    ax.plot(x, smooth, color=colour[i], linewidth=1.8)
                else:
                    ax.plot(x, y, color=colour[i], linewidth=1.5, marker="o", markersize=3)
                later = y[len(y) // 10:] or y  # past the first steps' warm-up
                if later:
                    mean_throughput[i] = sum(later) / len(later)
            step_axis(ax)
            ax.set_ylim(bottom=0)
            ax.set_ylabel("images/s")
            ax.set_title("training throughput" + (f": {mean_throughput[0]:,.0f} images/s on average"
                                                  if not many and 0 in mean_throughput else ""))
        elif panel == "gpu_memory":
            largest = max(m.get(k, 0) for r in runs for _, m in gpu_memory_points(r)
                          for k in ("in_use_bytes", "peak_bytes"))
            unit, size = byte_unit(largest)
            for i, run in enumerate(runs):
                points = gpu_memory_points(run)
                x = [s for s, _ in points]
                ax.plot(x, [m.get("in_use_bytes", 0) / size for _, m in points], color=colour[i], linewidth=1.5)
                ax.plot(x, [m.get("peak_bytes", 0) / size for _, m in points], color=colour[i], linewidth=1.5,
                        linestyle="--")
            step_axis(ax)
            ax.set_ylim(bottom=0)
            ax.set_ylabel(unit)
            ax.set_title("GPU memory")
            key_legend(ax, [style_key("-", "in use after the step"), style_key("--", "peak so far")])
        elif panel == "ledger":
            ledgers = [ledger_of(r) for r in runs]
            bars = [(key, text) for key, text in LEDGER_BARS if any(l.get(key) for l in ledgers)]
            largest = max(l.get(key, 0) for l in ledgers for key, _ in bars)
            unit, size = byte_unit(largest)
            height = 0.8 / len(runs)
            for i, ledger in enumerate(ledgers):
                # Top to bottom: the kinds in LEDGER_BARS's order, each with the runs in order.
                ys = [b - 0.4 + (i + 0.5) * height for b in range(len(bars))]
                widths = [ledger.get(key, 0) / size for key, _ in bars]
                ax.barh(ys, widths, height=height * 0.9, color=colour[i])
                for y, w in zip(ys, widths):
                    if w > 0:
                        ax.annotate(f"{w:,.1f} {unit}", (w, y), xytext=(3, 0), textcoords="offset points",
                                    va="center", fontsize="small")
            ax.set_yticks(range(len(bars)), [text for _, text in bars])
            ax.set_ylim(len(bars) - 0.5, -0.5)
            ax.set_xlim(0, largest / size * 1.25)
            ax.set_xlabel(unit)
            ax.grid(True, axis="x", alpha=0.3)
            sharded = any(l.get("parameters_bytes") for l in ledgers)
            ax.set_title("memory a rank holds (rank 0's ledger)" if sharded else "memory a step holds")
        elif panel in ("amax", "scale", "fp8_error"):
            layers = set()
            for i, run in enumerate(runs):
                logged = fp8_points(run)
                layers |= {f.get("layer") for _, f in logged if f.get("layer")}
                if panel == "fp8_error":
                    points = [(s, f.get("output_rel_error_vs_bf16")) for s, f in logged]
                    points = [(s, 100 * v) for s, v in points if v is not None and math.isfinite(v)]
                    ax.plot([s for s, _ in points], [v for _, v in points], color=colour[i], marker="o",
                            markersize=3, linewidth=1.5)
                    continue
                for key, style in (("input", "-"), ("weight", "--"), ("grad_output", ":")):
                    values = [(s, f.get(f"{key}_{panel}")) for s, f in logged]
                    values = [(s, v) for s, v in values if v is not None and v > 0]
                    if values:
                        ax.plot([s for s, _ in values], [v for _, v in values], color=colour[i], linestyle=style,
                                linewidth=1.8)
            layer = ", ".join(sorted(layers)) or "the logged layer"
            step_axis(ax)
            if panel == "fp8_error":
                ax.set_title(f"{layer}: FP8 output error, relative to bf16")
                ax.set_ylabel("‖y_fp8 − y_bf16‖ / ‖y_bf16‖")
                ax.yaxis.set_major_formatter(PercentFormatter(decimals=1))
                top = max([v for line in ax.get_lines() for v in line.get_ydata()] or [1])
                ax.set_ylim(0, 1.15 * top)
                continue
            ax.set_yscale("log")
            if panel == "amax":
                ax.set_title(f"{layer}: FP8 amaxes (largest |value| of the step)")
                ax.set_ylabel("amax")
            else:
                ax.set_title(f"{layer}: FP8 scales (format max / amax)")
                ax.set_ylabel("scale")
            key_legend(ax, [style_key("-", "input"), style_key("--", "weight"), style_key(":", "output gradient")])

    heading = title or default_title(runs, labels)
    if many:
        entries = []
        for i, label in enumerate(labels):
            figures = []
            if i in final_accuracy:
                figures.append(f"{final_accuracy[i][1]:.2f} % at step {final_accuracy[i][0]}")
            if i in mean_throughput:
                figures.append(f"{mean_throughput[i]:,.0f} images/s")
            text = f"{label}: {', '.join(figures)}" if figures else label
            entries.append(Line2D([], [], color=colour[i], linewidth=2.5, label=text))
        columns = min(len(entries), 3)
        legend_rows = (len(entries) + columns - 1) // columns
        room = (0.45 + 0.28 * legend_rows) / fig.get_figheight()
        fig.get_layout_engine().set(rect=(0, 0, 1, 1 - room))
        fig.legend(handles=entries, loc="upper center", bbox_to_anchor=(0.5, 1), ncol=columns, frameon=False,
                   title=heading, title_fontproperties={"size": "large", "weight": "bold"}, fontsize="medium")
    else:
        fig.suptitle(heading, fontsize="large", fontweight="bold")
    return fig, dict(zip(panels, flat))


def draw(runs, labels, title, output):
    """Writes the figure to `output`; returns the names of its panels."""
    import matplotlib.pyplot as plt

    fig, panels = make_figure(runs, labels, title)
    # Without matplotlib's own stamp (its version and address) in the file's metadata.
    stamp_key = {".png": "Software", ".pdf": "Creator", ".svg": "Creator"}.get(os.path.splitext(str(output))[1].lower())
    fig.savefig(output, dpi=110, metadata={stamp_key: None} if stamp_key else None)
    plt.close(fig)
    return list(panels)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", nargs="+", help="train_vit --metrics files (JSON Lines)")
    parser.add_argument("-o", "--output", required=True, help="the picture to write (.png, .svg or .pdf)")
    parser.add_argument("--labels", nargs="+", help="one label per metrics file, in order")
    parser.add_argument("--title", help="a title over the figure (default: what the runs trained)")
    args = parser.parse_args()
    if args.labels and len(args.labels) != len(args.metrics):
        sys.exit(f"plot_metrics: {len(args.labels)} labels for {len(args.metrics)} metrics files; give one each")
    runs = [read_run(p) for p in args.metrics]
    ensure_matplotlib()
    labels = args.labels or [label_of(p, r) for p, r in zip(args.metrics, runs)]
    panels = draw(runs, labels, args.title, args.output)
    print(f"plot_metrics: wrote {args.output} ({', '.join(panels)}; {len(runs)} run(s))")


if __name__ == "__main__":
    main()
