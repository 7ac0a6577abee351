#!/usr/bin/env python3
"""Pictures of train_vit runs, from the JSON Lines file each writes with --metrics.

    python3 tools/plot_metrics.py RUN.jsonl [MORE.jsonl ...] -o run.png [--labels a b ...] [--title T]

One figure, one panel each, every run overlaid in its own colour (to compare fp32, bf16 and fp8, or
DDP and FSDP):
  - training loss against step, with the learning rate on a second axis;
  - test accuracy at each evaluation;
  - images per second;
  - GPU memory in use and its peak, when the run was on a GPU;
  - for fp8 runs logged with --fp8-log-layer: that layer's amaxes (input, weight, output gradient)
    and its scales at each log step, on log axes.
Panels with nothing to show are left out. Each run is labelled by --labels, or else by its file's
name and its precision.

Uses matplotlib (Debian's python3-matplotlib, which tools/setup.sh installs); nothing else outside
the standard library. When the python3 running this script has no matplotlib (pyenv, conda and
virtual environments come first on PATH and do not see Debian's packages), the script runs itself
again with the first python3 on PATH that has it; where none has, it says which package to install.
"""
import argparse
import json
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
    return {"start": start, "steps": steps, "evals": evals}


def label_of(path, run):
    name = os.path.splitext(os.path.basename(path))[0]
    flags = (run["start"] or {}).get("flags", {})
    precision, parallel = flags.get("precision"), flags.get("parallel")
    extra = [p for p in (precision, parallel if parallel not in (None, "none") else None) if p]
    return f"{name} ({', '.join(extra)})" if extra else name


def series(events, key):
    """(steps, values) of the events that have `key`, in step order."""
    points = sorted((e["step"], e[key]) for e in events if e.get(key) is not None)
    return [p[0] for p in points], [p[1] for p in points]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", nargs="+", help="train_vit --metrics files (JSON Lines)")
    parser.add_argument("-o", "--output", required=True, help="the picture to write (.png, .svg or .pdf)")
    parser.add_argument("--labels", nargs="+", help="one label per metrics file, in order")
    parser.add_argument("--title", help="a title over the figure")
    args = parser.parse_args()
    if args.labels and len(args.labels) != len(args.metrics):
        sys.exit(f"plot_metrics: {len(args.labels)} labels for {len(args.metrics)} metrics files; give one each")

    runs = [read_run(p) for p in args.metrics]
    ensure_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    labels = args.labels or [label_of(p, r) for p, r in zip(args.metrics, runs)]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    panels = ["loss"]
    if any(r["evals"] for r in runs):
        panels.append("accuracy")
    if any(series(r["steps"], "images_per_sec")[0] for r in runs):
        panels.append("throughput")
    if any(e.get("memory") for r in runs for e in r["steps"]):
        panels.append("memory")
    if any("fp8" in e for r in runs for e in r["steps"]):
        panels += ["amax", "scale"]

    columns = 2
    rows = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(6.4 * columns, 3.8 * rows), squeeze=False)
    flat = [a for row in axes for a in row]
    for ax in flat[len(panels):]:
        ax.set_visible(False)

    lr_axis = None  # the loss panel's second axis, made with its first run
    for panel, ax in zip(panels, flat):
        for i, (run, label) in enumerate(zip(runs, labels)):
            c = colours[i % len(colours)]
            steps = run["steps"]
            if panel == "loss":
                ax.plot(*series(steps, "loss"), color=c, label=label, linewidth=1)
                ax.set_title("training loss (solid) and learning rate (dotted)")
                ax.set_ylabel("loss")
                if lr_axis is None:
                    lr_axis = ax.twinx()
                    lr_axis.set_ylabel("learning rate")
                lr_axis.plot(*series(steps, "lr"), color=c, linestyle=":", linewidth=1)
            elif panel == "accuracy":
                x, y = series(run["evals"], "accuracy")
                ax.plot(x, [100 * v for v in y], color=c, marker="o", label=label)
                ax.set_title("test accuracy")
                ax.set_ylabel("%")
            elif panel == "throughput":
                ax.plot(*series(steps, "images_per_sec"), color=c, label=label, linewidth=1)
                ax.set_title("training throughput")
                ax.set_ylabel("images/s")
            elif panel == "memory":
                mem = [(e["step"], e["memory"]) for e in steps if e.get("memory")]
                gib = 2.0 ** 30
                ax.plot([s for s, _ in mem], [m.get("in_use_bytes", 0) / gib for _, m in mem], color=c,
                        label=f"{label}: in use")
                ax.plot([s for s, _ in mem], [m.get("peak_bytes", 0) / gib for _, m in mem], color=c,
                        linestyle="--", label=f"{label}: peak")
                ax.set_title("GPU memory")
                ax.set_ylabel("GiB")
            elif panel in ("amax", "scale"):
                logged = [(e["step"], e["fp8"]) for e in steps if "fp8" in e]
                layer = logged[0][1].get("layer", "?") if logged else "?"
                for key, style in (("input", "-"), ("weight", "--"), ("grad_output", ":")):
                    values = [(s, f.get(f"{key}_{panel}")) for s, f in logged]
                    values = [(s, v) for s, v in values if v is not None and v > 0]
                    if values:
                        ax.plot([s for s, _ in values], [v for _, v in values], color=c, linestyle=style,
                                label=f"{label}: {key}")
                ax.set_yscale("log")
                ax.set_title(f"FP8 {'amax history' if panel == 'amax' else 'scales'} of {layer}")
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        if panel != "loss" or len(runs) > 1:
            ax.legend(fontsize="small")
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"plot_metrics: wrote {args.output} ({', '.join(panels)}; {len(runs)} run(s))")


if __name__ == "__main__":
    main()
