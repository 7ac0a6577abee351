#!/usr/bin/env python3
"""The GPU's clocks and power over each benchmark's timed steps, for tools/gpu_check.sh.

  gpu_clocks.py SAMPLES.csv LOG...

SAMPLES.csv is what `nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu[,
clocks_event_reasons.active] --format=csv,noheader,nounits -lms 100` wrote (the check names the fields
on a first line starting with '#'). Each LOG is a bench_vit or bench/pytorch_reference.py log: their JSON
lines carry the wall-clock window of their timed steps (timed_from, timed_to, seconds since the epoch).
For each such line, one line: the samples inside the window, as the median SM clock and its range, the
memory clock, the median and largest power draw, the temperature, and the reasons the driver gave for
holding the clocks down, with how many of the samples gave each.

Why: the third GPU run's ViT-H step took 7% longer than its kernels summed under ncu, where each kernel
runs alone on a GPU that has cooled and boosts. Whether a sustained step runs at lower clocks, and
whether Octet's step and PyTorch's run at the same ones, is read here.

Standard library only. Exits 0 whatever it finds (it reports; the check's verdicts are elsewhere).
"""
import datetime
import json
import os
import statistics
import sys

# The bits of nvidia-smi's clocks_event_reasons.active (clocks_throttle_reasons.active before).
REASONS = {
    0x1: "idle",
    0x2: "applications clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}


def number(text):
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def read_samples(path):
    """[(epoch seconds, {field: value})] from the sampler's file; unreadable lines are skipped."""
    fields, samples = None, []
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if line.startswith("#"):
                named = line.split("--query-gpu=", 1)
                if len(named) == 2:
                    fields = named[1].split()[0].split(",")
                continue
            if fields is None or not line:
                continue
            cells = [c.strip() for c in line.split(",")]
            if len(cells) != len(fields):
                continue
            row = dict(zip(fields, cells))
            try:
                # nvidia-smi writes the machine's local time; so does fromtimestamp below, on the same machine.
                t = datetime.datetime.strptime(row["timestamp"], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            except (KeyError, ValueError):
                continue
            samples.append((t, row))
    return samples


def runs(log):
    """(label, timed_from, timed_to) of every JSON line of LOG that has a window."""
    name = os.path.splitext(os.path.basename(log))[0]
    out = []
    try:
        with open(log, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        if not line.startswith('{"'):
            continue
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if "timed_from" not in j or "timed_to" not in j:
            continue
        label = j.get("bench", name)
        if label == "octet":
            label = name  # bench_vit's runs differ by their flags, which the log's name says
        out.append((label, float(j["timed_from"]), float(j["timed_to"])))
    return out


def describe(label, window):
    if not window:
        return f"{label}: no clock samples inside its timed steps"
    # Each field's words from its samples; a field the driver leaves N/A throughout is left out.
    words = (
        ("clocks.sm", lambda v: f"SM clock {statistics.median(v):.0f} MHz median ({min(v):.0f}-{max(v):.0f})"),
        ("clocks.mem", lambda v: f"memory clock {statistics.median(v):.0f} MHz"),
        ("power.draw", lambda v: f"power {statistics.median(v):.0f} W median ({max(v):.0f} W at most)"),
        ("temperature.gpu", lambda v: f"{max(v):.0f} C at most"),
    )
    parts = []
    for field, say in words:
        values = [v for v in (number(r.get(field, "")) for r in window) if v is not None]
        if values:
            parts.append(say(values))
    counts = {}
    for r in window:
        raw = r.get("clocks_event_reasons.active", r.get("clocks_throttle_reasons.active"))
        if raw is None:
            continue
        try:
            bits = int(raw, 16)
        except ValueError:
            continue
        for bit, name in REASONS.items():
            if bits & bit:
                counts[name] = counts.get(name, 0) + 1
    text = f"{label}: " + ", ".join(parts) + f" over {len(window)} samples"
    if counts:
        text += "; held down by " + ", ".join(f"{n} ({c} of {len(window)})" for n, c in sorted(counts.items()))
    elif any(k.endswith("reasons.active") for k in window[0]):
        text += "; nothing held the clocks down"
    return text


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        samples = read_samples(argv[0])
    except OSError as e:
        print(f"no clock samples: {e}")
        return 0
    for log in argv[1:]:
        for label, start, end in runs(log):
            print(describe(label, [row for t, row in samples if start <= t <= end]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
