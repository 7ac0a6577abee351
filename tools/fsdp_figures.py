#!/usr/bin/env python3
"""Figures for docs/fsdp.md, from one FSDP run of train_vit: every number in them comes from here.

    python3 tools/fsdp_figures.py --trace t.rank0.json --metrics m.jsonl [--log train.log]
                                  [--trace t.rank1.json ...] [--step N] [--width 100]
    python3 tools/fsdp_figures.py --step-times a.jsonl b.jsonl ...   (step times of untraced runs)
    python3 tools/fsdp_figures.py --index ckpt/step-N/index.json      (the flat parameters of a checkpoint)
    python3 tools/fsdp_figures.py --compare full=runs/full grad-op=runs/grad-op ...   (runs side by side)

Reads the per-rank Chrome trace that `train_vit --trace` writes (tracks "compute", "comm", "fsdp",
"fsdp wait") and the `--metrics` JSON Lines file, and prints markdown:

  (a) one step's FSDP events per unit in time order, with the collectives that carried them on the
      "comm" track, how long compute waited for each gather ("fsdp wait") and what the "compute"
      track was running at that moment; then the waits summed per pass;
  (b) an ASCII timeline of the step, one row per track;
  (c) how many units were gathered at each moment, and the gathered bytes (units plus gradients in
      flight), rebuilt from the events and set against the ledger;
  (d) the memory ledger of that step and the 16·Ψ/N check;
  (e) the bytes the step's collectives moved, against the sharding strategy's theory;
  (f) with more than one --trace: the same step on every rank, in one line each.

The first --trace is the rank drawn in detail. Python 3 standard library only.
"""
import argparse
import json
import re
import sys


class Span:
    def __init__(self, name, track, start, dur):
        self.name, self.track, self.start, self.dur = name, track, start, dur

    @property
    def end(self):
        return self.start + self.dur


def read_trace(path):
    """Spans ("X" events) with their track name, in start order."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    spans = [Span(e["name"], tracks.get((e["pid"], e["tid"]), str(e["tid"])), e["ts"], e.get("dur", 0))
             for e in events if e.get("ph") == "X"]
    spans.sort(key=lambda s: (s.start, -s.dur))
    return spans


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_log(path):
    """What train_vit's log says about the model and the sharding (None where it says nothing)."""
    text = open(path).read()
    info = {}
    m = re.search(r"(\S+): (\d+) parameters", text)
    if m:
        info["model"], info["parameters"] = m.group(1), int(m.group(2))
    m = re.search(r"fully sharded over (\d+) ranks \(([^)]*)\): (\d+) flat parameters \((\d+) elements with padding\), "
                  r"gathered in (?:e4m3 \((\d+) elements: the FP8 Linears' weights\) and )?(\w+), "
                  r"gradients reduce-scattered in (\w+)", text)
    if m:
        info.update(world=int(m.group(1)), how=m.group(2), flats=int(m.group(3)), padded=int(m.group(4)),
                    fp8_elements=int(m.group(5) or 0), gather_dtype=m.group(6), reduce_dtype=m.group(7))
    return info


DTYPE_BYTES = {"f32": 4, "bf16": 2}


def unit_of(name):
    """'gather blocks.3' -> 'blocks.3'; 'backward blocks.3' -> 'blocks.3'; root modules -> 'root'."""
    rest = name.split(" ", 1)[1] if " " in name else name
    m = re.match(r"(blocks\.\d+)", rest)
    return m.group(1) if m else "root"


def unit_char(unit):
    """One character per unit on the timeline: blocks.k -> k (0-9, then a-z), the root -> r."""
    m = re.match(r"blocks\.(\d+)$", unit)
    if not m:
        return "r"
    k = int(m.group(1))
    return str(k) if k < 10 else (chr(ord("a") + k - 10) if k < 36 else "#")


def size_bytes(name, multiple):
    """The byte count in a collective's name ('all_gather of 294.91 kB'), exact where the rounding
    leaves one multiple of `multiple` (a flat is padded to a multiple of N elements)."""
    m = re.search(r"of ([\d.]+) (B|kB|MB|GB)$", name)
    if not m:
        return None, False
    value, unit = float(m.group(1)), m.group(2)
    if unit == "B":
        return int(value), True
    scale = {"kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
    low, high = (value - 0.005) * scale, (value + 0.005) * scale
    first = -(-int(low) // multiple) * multiple
    candidates = [b for b in range(first, int(high) + 1, multiple) if low <= b < high]
    if len(candidates) == 1:
        return candidates[0], True
    return int(round(value * scale)), False


class Step:
    """The spans of one traced step, sorted into what FSDP did and what carried it."""

    def __init__(self, spans, step_name, multiple):
        steps = [s for s in spans if s.name.startswith("step ")]
        if not steps:
            sys.exit("fsdp_figures: the trace has no 'step N' span; record it with train_vit --trace")
        chosen = [s for s in steps if s.name == step_name] if step_name else steps[:1]
        if not chosen:
            sys.exit(f"fsdp_figures: no span '{step_name}' in the trace; it has " + ", ".join(s.name for s in steps))
        self.span = chosen[0]
        self.t0, self.t1 = self.span.start, self.span.end
        inside = [s for s in spans if self.t0 <= s.start <= self.t1 and s is not self.span]
        self.compute = [s for s in inside if s.track == "compute" and s.name.split(" ")[0] in ("forward", "backward")]
        self.comm = [s for s in inside if s.track == "comm"]
        self.fsdp = [s for s in inside if s.track == "fsdp"]
        # "wait <unit>": the part of a gather that the thread needing the unit spent blocked on it;
        # "wait reduce_scatter <unit>" (8fe265c on): backward blocked on that unit's reduce-scatter.
        waits = [s for s in inside if s.track == "fsdp wait"]
        self.waits = [s for s in waits if not s.name.startswith("wait reduce_scatter ")]
        self.rs_waits = [s for s in waits if s.name.startswith("wait reduce_scatter ")]
        self.multiple = multiple
        self._match()

    def ms(self, t):
        return (t - self.t0) / 1000.0

    def computing(self, t):
        """The innermost forward/backward span covering t (ties: the one that started last)."""
        covering = [s for s in self.compute if s.start <= t <= s.end]
        if not covering:
            return None
        return max(covering, key=lambda s: (s.start, -s.dur))

    def _match(self):
        # Every gather's all-gathers run between its issue and its ready moment (the group runs
        # collectives in order and ensure_gathered waits for them), and gathers never overlap.
        self.gathers = [s for s in self.fsdp if s.name.startswith("gather ")]
        all_gathers = [c for c in self.comm if c.name.startswith("all_gather")]
        self.carried = {}
        for g in self.gathers:
            self.carried[id(g)] = [c for c in all_gathers if g.start <= c.start and c.end <= g.end]
        used = {id(c) for cs in self.carried.values() for c in cs}
        self.unmatched_gathers = [c for c in all_gathers if id(c) not in used]
        # Reduce-scatters: one fsdp span per trainable flat, launched in the order the comm thread runs them.
        launches = [s for s in self.fsdp if s.name.startswith("reduce_scatter ")]
        launches.sort(key=lambda s: s.start)
        scatters = [c for c in self.comm if c.name.startswith("reduce_scatter")]
        if not scatters:  # NO_SHARD all-reduces each flat gradient instead (the loss's average comes after)
            scatters = [c for c in self.comm if c.name.startswith("all_reduce(avg)")][:len(launches)]
        self.scatter_of = dict(zip((id(s) for s in launches), scatters)) if len(launches) == len(scatters) else {}
        self.launches = launches
        self.frees = [s for s in self.fsdp if s.name.startswith("free ")]
        # Which unit each collective carried, for the timeline.
        self.comm_unit = {}
        for g in self.gathers:
            for c in self.carried[id(g)]:
                self.comm_unit[id(c)] = unit_of(g.name)
        for s in launches:
            if id(s) in self.scatter_of:
                self.comm_unit[id(self.scatter_of[id(s)])] = unit_of(s.name)

    def wait_of(self, gather):
        """The wait span that ends with the gather (both end when the unit is ready), or None."""
        unit = unit_of(gather.name)
        found = [w for w in self.waits if unit_of(w.name) == unit and abs(w.end - gather.end) <= 1]
        return found[0] if found else None

    def bytes_of(self, collectives):
        total, exact = 0, True
        for c in collectives:
            b, e = size_bytes(c.name, self.multiple)
            total += b or 0
            exact = exact and e
        return total, exact

    def pass_of(self, t):
        top = [s for s in self.compute if s.name in ("forward VisionTransformer", "backward VisionTransformer")
               and s.start <= t <= s.end]
        if top:
            return top[0].name.split(" ")[0]
        forwards = [s for s in self.compute if s.name == "forward VisionTransformer"]
        backwards = [s for s in self.compute if s.name == "backward VisionTransformer"]
        if backwards and t > backwards[0].end:
            return "after"
        if forwards and t < forwards[0].start:
            return "before"
        return "between"


def fmt_ms(x):
    return f"{x:.2f}"


def events_table(step):
    rows = []
    # Gathers: issue -> ready, with the all-gathers that carried them.
    for g in step.gathers:
        carried = step.carried[id(g)]
        b, exact = step.bytes_of(carried)
        if carried:
            transfer = f"{fmt_ms(step.ms(carried[0].start))}–{fmt_ms(step.ms(carried[-1].end))}"
            slack = fmt_ms((g.end - carried[-1].end) / 1000.0)
        else:
            transfer, slack = "—", "—"
        doing = step.computing(g.start)
        wait = step.wait_of(g)
        rows.append((g.start, "gather (issue → ready)", unit_of(g.name), fmt_ms(step.ms(g.start)), fmt_ms(g.dur / 1000.0),
                     f"{len(carried)} all_gather, {b if exact else '≈' + str(b)} B: {transfer}", slack,
                     doing.name if doing else "—", fmt_ms(wait.dur / 1000.0) if wait else "—"))
    for f in step.frees:
        doing = step.computing(f.start)
        rows.append((f.start, "free", unit_of(f.name), fmt_ms(step.ms(f.start)), "", "", "", doing.name if doing else "—", ""))
    # Reduce-scatters: one row per unit (its flats are launched together).
    by_unit = []
    for s in step.launches:
        if by_unit and by_unit[-1][0] == unit_of(s.name):
            by_unit[-1][1].append(s)
        else:
            by_unit.append((unit_of(s.name), [s]))
    for unit, spans in by_unit:
        scatters = [step.scatter_of[id(s)] for s in spans if id(s) in step.scatter_of]
        b, exact = step.bytes_of(scatters)
        start, end = spans[0].start, max(s.end for s in spans)
        transfer = (f"{len(scatters)} reduce_scatter, {b if exact else '≈' + str(b)} B: "
                    f"{fmt_ms(step.ms(scatters[0].start))}–{fmt_ms(step.ms(scatters[-1].end))}") if scatters else "—"
        doing = step.computing(start)
        rows.append((start, "reduce-scatter (launch → collected)", unit, fmt_ms(step.ms(start)), fmt_ms((end - start) / 1000.0),
                     transfer, "", doing.name if doing else "—", ""))
    # The other collectives of the step (gradient-norm clipping, the logged loss).
    fsdp_carried = set(step.comm_unit)
    for c in step.comm:
        if id(c) in fsdp_carried or c in step.unmatched_gathers:
            continue
        doing = step.computing(c.start)
        rows.append((c.start, "other collective", "—", fmt_ms(step.ms(c.start)), fmt_ms(c.dur / 1000.0), c.name, "",
                     doing.name if doing else "— (" + step.pass_of(c.start) + " backward)", ""))
    rows.sort(key=lambda r: r[0])
    out = ["| # | start (ms) | event | unit | duration (ms) | on the comm track (ms) | ready − transfer end (ms) | "
           "compute waited (ms) | compute track at the start |",
           "|---:|---:|---|---|---:|---|---:|---:|---|"]
    for i, r in enumerate(rows, 1):
        out.append(f"| {i} | {r[3]} | {r[1]} | {r[2]} | {r[4]} | {r[5]} | {r[6]} | {r[8]} | {r[7]} |")
    return "\n".join(out)


def waits_by_pass(step):
    """{pass: (total µs, [(unit, µs)])} of the waits for gathers, by the pass they fell in."""
    out = {}
    for w in step.waits:
        where = step.pass_of(w.start)
        where = "forward" if where == "before" else where  # the root's gather, in the pre-hook of forward
        total, each = out.get(where, (0, []))
        out[where] = (total + w.dur, each + [(unit_of(w.name), w.dur)])
    return out


def reduce_waits(step):
    """[(start, end, units)]: where backward waited for reduce-scatters. Traces from 8fe265c on mark
    them ("wait reduce_scatter <unit>" on the "fsdp wait" track). Older ones do not, and the waits are
    rebuilt: FSDP collects reduce-scatters (result into the shard, full gradient freed) only in the
    call after each launch and at the end of backward, where each "reduce_scatter" span ends (3c05345
    on). A collection in [launch i, launch i+1) whose transfer still ran at launch i was waited for
    from launch i."""
    if step.rs_waits:
        return [(s.start, s.end, [s.name.rsplit(" ", 1)[1]]) for s in step.rs_waits]
    launches = sorted((s for s in step.launches if id(s) in step.scatter_of), key=lambda s: s.start)
    out = []
    for i, launch in enumerate(launches):  # after the last launch, the end of backward collects them all
        last = i + 1 == len(launches)
        until = float("inf") if last else launches[i + 1].start
        waited = [s for s in launches if (last or s.start < launch.start) and launch.start <= s.end < until
                  and step.scatter_of[id(s)].end > launch.start]
        if waited:
            out.append((launch.start, max(s.end for s in waited), sorted({unit_of(s.name) for s in waited})))
    return out


def waits_summary(step):
    if not step.waits:
        return "The trace has no \"fsdp wait\" track (a binary older than 3c05345): the waits are not recorded."
    passes = [s for s in step.compute if s.name in ("forward VisionTransformer", "backward VisionTransformer")]
    lines = []
    for where, (total, each) in waits_by_pass(step).items():
        span = [s for s in passes if s.name.startswith(where)]
        of = f" of the {fmt_ms(span[0].dur / 1000.0)} ms {where} pass" if span else ""
        longest = max(each, key=lambda e: e[1])
        lines.append(f"{where}: {fmt_ms(total / 1000.0)} ms in {len(each)} wait(s){of}, the longest "
                     f"{fmt_ms(longest[1] / 1000.0)} ms for {longest[0]}")
    text = "Compute waited for gathers (the \"fsdp wait\" track): " + "; ".join(lines) + "."
    waits = reduce_waits(step)
    if waits:
        total = sum(e - s for s, e, _ in waits)
        longest = max(waits, key=lambda w: w[1] - w[0])
        source = ("the \"wait reduce_scatter\" spans on the \"fsdp wait\" track" if step.rs_waits else
                  "rebuilt from the \"reduce_scatter\" spans, which end when FSDP collects the result")
        text += (f"\n\nBackward also waited for reduce-scatters ({source}: the rate limit on gradients in flight, "
                 f"and the end of backward): "
                 f"{fmt_ms(total / 1000.0)} ms in {len(waits)} wait(s), the longest "
                 f"{fmt_ms((longest[1] - longest[0]) / 1000.0)} ms ({fmt_ms(step.ms(longest[0]))}–"
                 f"{fmt_ms(step.ms(longest[1]))} ms, for {', '.join(longest[2])}).")
    return text


def timeline(step, width):
    t0, t1 = step.t0, step.t1
    cell = (t1 - t0) / width

    def paint(spans, char_of, row=None):
        row = row or [" "] * width
        best = [0.0] * width
        for s in spans:
            first = max(0, int((s.start - t0) / cell))
            last = min(width - 1, int((max(s.end, s.start + 1) - t0 - 1e-9) / cell))
            for i in range(first, last + 1):
                lo, hi = t0 + i * cell, t0 + (i + 1) * cell
                overlap = min(hi, max(s.end, s.start + 1)) - max(lo, s.start)
                if overlap > best[i]:
                    best[i], row[i] = overlap, char_of(s)
        return "".join(row)
    top = [s for s in step.compute if s.name.endswith("VisionTransformer")]
    modules = [s for s in step.compute if not s.name.endswith("VisionTransformer")]
    passes = paint(top, lambda s: "F" if s.name.startswith("forward") else "B", ["o"] * width)
    inside = paint(top, lambda s: "·")  # inside a pass but in no module span: waiting on FSDP (or glue)
    compute = paint(modules, lambda s: unit_char(unit_of(s.name)), list(inside))
    gathers = paint(step.gathers, lambda s: unit_char(unit_of(s.name)))
    waits = paint(step.waits, lambda s: unit_char(unit_of(s.name)))
    rs_waits = paint([Span("wait " + units[0], "", start, end - start) for start, end, units in reduce_waits(step)],
                     lambda s: unit_char(unit_of(s.name)))
    frees = paint(step.frees, lambda s: unit_char(unit_of(s.name)))
    # A launch is a moment; the fsdp span runs on until FSDP collects the result. Mark the launch only.
    launches = paint([Span(s.name, s.track, s.start, 1) for s in step.launches], lambda s: unit_char(unit_of(s.name)))
    ag = paint([c for c in step.comm if c.name.startswith("all_gather")], lambda c: unit_char(step.comm_unit.get(id(c), "?")))
    rs = paint([c for c in step.comm if c.name.startswith("reduce_scatter")],
               lambda c: unit_char(step.comm_unit.get(id(c), "?")))
    other = paint([c for c in step.comm if not c.name.startswith(("all_gather", "reduce_scatter"))], lambda c: "*")
    counts = gathered_counts(step)
    count = []
    for i in range(width):  # the most units gathered at any moment of the column
        lo, hi = t0 + i * cell, t0 + (i + 1) * cell
        at_start = [n for t, n in counts if t <= lo][-1:] or [0]
        count.append(str(max(at_start + [n for t, n in counts if lo < t < hi])))
    rows = [("pass", passes), ("compute", compute), ("fsdp gather", gathers), ("fsdp wait", waits), ("fsdp free", frees),
            ("fsdp rs launch", launches), ("fsdp rs wait", rs_waits), ("comm all_gather", ag), ("comm reduce_scat", rs),
            ("comm other", other), ("units gathered", "".join(count))]
    label = max(len(r[0]) for r in rows)
    scale = f"{'':{label}} |0 ms{'':{width - 4 - len(fmt_ms((t1 - t0) / 1000.0)) - 3}}{fmt_ms((t1 - t0) / 1000.0)} ms|"
    out = ["```", f"{step.span.name}: {fmt_ms((t1 - t0) / 1000.0)} ms, {width} columns of {cell / 1000.0:.2f} ms", scale]
    out += [f"{name:{label}} |{row}|" for name, row in rows]
    out += ["```"]
    return "\n".join(out)


def gathered_counts(step):
    """(time, non-root units gathered from then on): +1 at a gather's issue, -1 at its free."""
    if getattr(step, "_counts", None) is None:
        changes = [(g.start, +1) for g in step.gathers if unit_of(g.name) != "root"]
        changes += [(f.start, -1) for f in step.frees if unit_of(f.name) != "root"]
        changes.sort(key=lambda c: (c[0], c[1]))  # a free and a gather at one moment: the free first
        # Units still gathered when the step began (NO_SHARD keeps them): freed before any gather of theirs.
        first_gather = {}
        for g in step.gathers:
            first_gather.setdefault(unit_of(g.name), g.start)
        before = sum(1 for f in step.frees if unit_of(f.name) != "root"
                     and f.start <= first_gather.get(unit_of(f.name), float("inf"))
                     and not any(unit_of(g.name) == unit_of(f.name) and g.start <= f.start for g in step.gathers))
        n, counts = before, [(step.t0, before)]
        for t, d in changes:
            n += d
            counts.append((t, n))
        step._counts = counts
    return step._counts


def gathered_figure(step, ledger):
    counts = gathered_counts(step)
    out = ["| from (ms) | to (ms) | non-root units gathered | which |", "|---:|---:|---:|---|"]
    live = []
    events = sorted([(g.start, +1, unit_of(g.name)) for g in step.gathers if unit_of(g.name) != "root"] +
                    [(f.start, -1, unit_of(f.name)) for f in step.frees if unit_of(f.name) != "root"],
                    key=lambda e: (e[0], e[1]))
    prev_t = step.t0
    for t, d, unit in events:
        if t > prev_t:
            out.append(f"| {fmt_ms(step.ms(prev_t))} | {fmt_ms(step.ms(t))} | {len(live)} | {', '.join(live) or '—'} |")
        if d > 0:
            live.append(unit)
        elif unit in live:
            live.remove(unit)
        prev_t = t
    out.append(f"| {fmt_ms(step.ms(prev_t))} | {fmt_ms(step.ms(step.t1))} | {len(live)} | {', '.join(live) or '—'} |")
    most = max(n for _, n in counts)
    out.append("")
    out.append(f"Most non-root units gathered at once in this step (from the trace): **{most}**"
               + (f"; the ledger's max_units_gathered (since the start of the run): **{ledger['max_units_gathered']}**."
                  if ledger else "."))
    # Bytes: a unit's buffers from issue to free, a flat's full gradient from launch to its collection.
    deltas, exact_all = [], True
    root_bytes = 0
    for g in step.gathers:
        b, exact = step.bytes_of(step.carried[id(g)])
        exact_all = exact_all and exact
        deltas.append((g.start, b, "gather " + unit_of(g.name)))
        if unit_of(g.name) == "root":
            root_bytes = b
        freed = [f for f in step.frees if unit_of(f.name) == unit_of(g.name) and f.start >= g.start]
        if freed:
            deltas.append((freed[0].start, -b, "free " + unit_of(g.name)))
    for s in step.launches:
        c = step.scatter_of.get(id(s))
        if c is None:
            continue
        b, exact = size_bytes(c.name, step.multiple)
        exact_all = exact_all and exact
        deltas.append((s.start, b, "launch " + unit_of(s.name)))
        deltas.append((s.end, -b, "collected " + unit_of(s.name)))
    deltas.sort(key=lambda d: (d[0], d[1]))
    level, peak, peak_at = 0, 0, step.t0
    for t, b, _ in deltas:
        level += b
        if level > peak:
            peak, peak_at = level, t
    q = "" if exact_all else "≈"
    out.append("")
    if not any(step.carried[id(g)] for g in step.gathers):
        out.append("The gathers ran no collective (NO_SHARD copies each unit from the rank's full copy), so the "
                   "trace cannot rebuild the gathered bytes" + (f"; the ledger's peak_gathered_bytes: "
                                                                f"**{ledger['peak_gathered_bytes']:,} B**." if ledger else "."))
        return "\n".join(out)
    out.append(f"Gathered bytes rebuilt from the trace (gathered units from issue to free, full flat gradients "
               f"from reduce-scatter launch to the moment FSDP collected the result and freed them): "
               f"peak **{q}{peak:,} B** at "
               f"{fmt_ms(step.ms(peak_at))} ms ({step.pass_of(peak_at)}), of which the root's gathered "
               f"buffers are {q}{root_bytes:,} B" + (f"; the ledger's peak_gathered_bytes: **{ledger['peak_gathered_bytes']:,} B**."
                                                     if ledger else "."))
    in_flight = [s for s in step.launches if s.start <= peak_at < s.end]
    if in_flight:
        b = sum(size_bytes(step.scatter_of[id(s)].name, step.multiple)[0] for s in in_flight if id(s) in step.scatter_of)
        units = len({unit_of(s.name) for s in in_flight})
        out.append(f"At that moment {len(in_flight)} full flat gradient(s) ({q}{b:,} B) of {units} unit(s) are held "
                   f"for reduce-scatters not yet collected.")
    return "\n".join(out)


def ledger_figure(ledger, step_no, start, log, world):
    p, g, o = ledger["parameters_bytes"], ledger["gradients_bytes"], ledger["optimizer_bytes"]
    total = ledger["sharded_total_bytes"]
    out = [f"Memory ledger of rank 0 after step {step_no} (`--metrics`, `memory_ledger`):", "",
           "| held by | bytes | per shard element |", "|---|---:|---:|"]
    shard_elements = p // 4  # the shards are f32 master weights
    for name, b in (("parameter shards (f32)", p), ("gradient shards (f32)", g), ("optimizer state", o),
                    ("sharded total", total), ("gathered now (after the step)", ledger["gathered_bytes"]),
                    ("peak gathered (units + gradients in flight)", ledger["peak_gathered_bytes"])):
        per = f"{b / shard_elements:.2f}" if shard_elements else "—"
        out.append(f"| {name} | {b:,} | {per} |")
    casts = ledger.get("fp8_weight_casts_bytes")
    if casts is not None and (log or {}).get("how") is not None and start.get("flags", {}).get("precision") == "fp8":
        per = f"{casts / shard_elements:.2f}" if shard_elements else "—"
        out.append(f"| FP8 weight casts the Linears keep (not in the peak above) | {casts:,} | {per} |")
    out.append("")
    psi = (log or {}).get("parameters") or start.get("parameters")
    padded = (log or {}).get("padded")
    # The shards per flat: the ledger says (G under hybrid sharding); older metrics do not.
    n = ledger.get("shard_group_size") or (1 if start.get("flags", {}).get("sharding") == "none" else world)
    lines = [f"- Shard elements per rank: parameters_bytes / 4 = {shard_elements:,}; × N = {n} shard(s): "
             f"{shard_elements * n:,} elements"
             + (f" (the log: {padded:,} elements with padding, {'equal' if padded == shard_elements * n else 'DIFFERENT'})"
                if padded else "") + "."]
    if psi:
        pad = shard_elements * n - psi
        lines.append(f"- Ψ = {psi:,} parameters (`{start.get('model', (log or {}).get('model', 'model'))}`), so padding = "
                     f"{shard_elements * n:,} − {psi:,} = {pad:,} elements over all flat parameters.")
    if g == p and o == 2 * p:
        lines.append(f"- AdamW: gradients = parameters, optimizer = 2 × parameters (two moments), so sharded total = "
                     f"4 × {p:,} = {4 * p:,} B {'=' if 4 * p == total else '≠'} {total:,} B.")
        if psi:
            exact = 16 * psi / n
            lines.append(f"- 16·Ψ/N = 16 × {psi:,} / {n} = {exact:,.0f} B, plus 16 × {shard_elements * n - psi} "
                         f"padding elements / {n} = {16 * (shard_elements * n - psi) / n:,.0f} B: "
                         f"{exact + 16 * (shard_elements * n - psi) / n:,.0f} B "
                         f"{'=' if exact + 16 * (shard_elements * n - psi) / n == total else '≠'} the ledger's {total:,} B.")
            lines.append(f"- One process (or DDP) holds 16·Ψ = {16 * psi:,} B for the same model: "
                         f"{16 * psi / total:.2f} × this rank's sharded total.")
    else:
        lines.append(f"- Not plain AdamW over every parameter (gradients {g:,} B, optimizer {o:,} B for {p:,} B of "
                     f"parameters): frozen flat parameters have no gradient and no optimizer state.")
    out += lines
    return "\n".join(out)


def volume_figure(step, world, log, sharding):
    out = ["| collective | calls | payload (B) | sent per rank by a ring algorithm (B) |", "|---|---:|---:|---:|"]
    kinds = {}
    for c in step.comm:
        kind = c.name.split(" ")[0].split("(")[0]
        b, exact = size_bytes(c.name, step.multiple)
        n, total, ex = kinds.get(kind, (0, 0, True))
        kinds[kind] = (n + 1, total + (b or 0), ex and exact)
    for kind, (n, total, exact) in kinds.items():
        q = "" if exact else "≈"
        factor = {"all_gather": (world - 1) / world, "reduce_scatter": (world - 1) / world,
                  "all_reduce": 2 * (world - 1) / world}.get(kind)
        share = f"{q}{total * factor:,.0f}" if factor is not None else "—"
        out.append(f"| {kind} | {n} | {q}{total:,} | {share} |")
    padded = (log or {}).get("padded")
    root = [g for g in step.gathers if unit_of(g.name) == "root"]
    if padded and root and (log or {}).get("gather_dtype") in DTYPE_BYTES and sharding in ("full", "grad-op"):
        b = DTYPE_BYTES[log["gather_dtype"]]
        root_bytes, exact = step.bytes_of(step.carried[id(root[0])])
        q = "" if exact else "≈"
        out.append("")
        fp8 = log.get("fp8_elements", 0)
        # Bytes of one gather of every unit: b per element, 1 for the FP8 Linears' weights (--fp8-all-gather).
        per_pass = b * (padded - fp8) + fp8
        elements = (f"({b} × {padded - fp8:,} + 1 × {fp8:,} elements of FP8 Linears' weights)" if fp8
                    else f"{b} × {padded:,} elements")
        if sharding == "full":
            gathered = (f"FULL_SHARD theory: every block unit gathered twice and the root once, {b} B per element"
                        f"{', 1 B per FP8 weight element' if fp8 else ''}: 2 × {elements} − {q}{root_bytes:,} B "
                        f"(the root's second gather, skipped) = {q}{2 * per_pass - root_bytes:,} B all-gathered")
        else:
            gathered = (f"SHARD_GRAD_OP theory: every unit gathered once, {b} B per element"
                        f"{', 1 B per FP8 weight element' if fp8 else ''}: {elements} = {per_pass:,} B all-gathered")
        out.append(f"{gathered}; every trainable flat reduce-scattered once: "
                   f"{DTYPE_BYTES.get(log.get('reduce_dtype'), b)} × {padded:,} = "
                   f"{DTYPE_BYTES.get(log.get('reduce_dtype'), b) * padded:,} B (fewer with frozen flats).")
        psi = log.get("parameters")
        scattered = kinds.get("reduce_scatter", (0, 0, True))[1]
        out.append("")
        if psi and abs(scattered - DTYPE_BYTES.get(log.get("reduce_dtype"), b) * padded) < 16 * len(step.launches):
            out.append(f"DDP moves, for the same model, one all-reduce of the gradients: 2 × (N−1)/N × 4 × Ψ = "
                       f"{2 * (world - 1) / world * 4 * psi:,.0f} B sent per rank.")
    return "\n".join(out)


def rank_line(path, step_name, multiple):
    step = Step(read_trace(path), step_name, multiple)
    fwd = [s for s in step.compute if s.name == "forward VisionTransformer"]
    bwd = [s for s in step.compute if s.name == "backward VisionTransformer"]
    blocks_f = [s for s in step.compute if s.name.startswith("forward blocks.")]
    blocks_b = [s for s in step.compute if s.name.startswith("backward blocks.")]
    # In forward, time inside the pass but in no module span is mostly FSDP's hooks waiting for a
    # gather; the "fsdp wait" track measures those waits directly, in backward too (there they lie
    # inside the previous module's backward span).
    f_idle = 0
    if fwd:
        children = sorted((s for s in step.compute if s.name.startswith("forward ") and s is not fwd[0]
                           and fwd[0].start <= s.start <= fwd[0].end), key=lambda s: s.start)
        covered_until = fwd[0].start
        for s in children:
            if s.start > covered_until:
                f_idle += s.start - covered_until
            covered_until = max(covered_until, s.end)
        f_idle += max(0, fwd[0].end - covered_until)
    comm_busy = sum(c.dur for c in step.comm)
    waits = waits_by_pass(step)
    waited = lambda where: fmt_ms(waits.get(where, (0, []))[0] / 1000.0) if step.waits else "—"
    rs_waited = fmt_ms(sum(e - s for s, e, _ in reduce_waits(step)) / 1000.0)
    avg = lambda xs: sum(s.dur for s in xs) / len(xs) / 1000.0 if xs else 0.0
    return (f"| {path.rsplit('/', 1)[-1]} | {fmt_ms(step.span.dur / 1000.0)} | {fmt_ms(fwd[0].dur / 1000.0) if fwd else '—'} | "
            f"{fmt_ms(f_idle / 1000.0)} | {waited('forward')} | {fmt_ms(avg(blocks_f))} | "
            f"{fmt_ms(bwd[0].dur / 1000.0) if bwd else '—'} | {waited('backward')} | {rs_waited} | {fmt_ms(avg(blocks_b))} | "
            f"{fmt_ms(comm_busy / 1000.0)} | {max(n for _, n in gathered_counts(step))} |")


def flats_figure(index_path):
    """The flat parameters as a sharded checkpoint's index.json lists them."""
    index = json.load(open(index_path))
    out = [f"{len(index['flat_parameters'])} flat parameters, checkpoint written at N = {index['world_size']} "
           f"({index['optimizer']['name'] if index.get('optimizer') else 'no optimizer'}):", "",
           "| flat | unit | key | trainable | parameters | numel | padded | padding | shard per rank |",
           "|---:|---|---:|---|---|---:|---:|---:|---:|"]
    for f, flat in enumerate(index["flat_parameters"]):
        names = [p["name"] for p in flat["parameters"]]
        listed = ", ".join(names) if len(names) <= 3 else f"{len(names)}: {names[0]} … {names[-1]}"
        out.append(f"| {f} | {flat['unit'] or 'root'} | {flat['key']} | {'yes' if flat['trainable'] else 'no (frozen)'} | "
                   f"{listed} | {flat['numel']:,} | {flat['padded_numel']:,} | {flat['padded_numel'] - flat['numel']} | "
                   f"{flat['shard_numel']:,} |")
    total = sum(f["numel"] for f in index["flat_parameters"])
    padded = sum(f["padded_numel"] for f in index["flat_parameters"])
    out.append(f"| | | | | all | {total:,} | {padded:,} | {padded - total} | {padded // index['world_size']:,} |")
    return "\n".join(out)


def compare_figure(runs):
    """One column per run directory (t.rank0.json, m.jsonl, train.log, as train_vit writes them)."""
    cols = []
    for label, folder in runs:
        metrics = read_metrics(f"{folder}/m.jsonl")
        start = next((m for m in metrics if m.get("event") == "start"), {})
        flags = start.get("flags", {})
        log = read_log(f"{folder}/train.log")
        world = int(flags.get("world_size", 1))
        shards = 1 if flags.get("sharding") == "none" else world
        multiple = shards * min(DTYPE_BYTES.get(log.get("gather_dtype"), 2), DTYPE_BYTES.get(log.get("reduce_dtype"), 2))
        step = Step(read_trace(f"{folder}/t.rank0.json"), None, multiple)
        step_no = int(step.span.name.split(" ")[1])
        ledger = next(m["memory_ledger"] for m in metrics if m.get("event") == "step" and m.get("step") == step_no)
        sums = {}
        for c in step.comm:
            kind = c.name.split(" ")[0].split("(")[0]
            b, exact = size_bytes(c.name, multiple)
            n, total, ex = sums.get(kind, (0, 0, True))
            sums[kind] = (n + 1, total + b, ex and exact)
        def moved(kind, factor):
            n, total, exact = sums.get(kind, (0, 0, True))
            q = "" if exact else "≈"
            return f"{q}{total:,} in {n}; {q}{total * factor(world):,.0f} sent" if n else "—"
        ring = lambda n: (n - 1) / n
        factors = {"all_gather": ring(world), "reduce_scatter": ring(world), "all_reduce": 2 * ring(world)}
        sent = sum(total * factors.get(kind, 0) for kind, (_, total, _) in sums.items())
        approx = "" if all(ex for _, _, ex in sums.values()) else "≈"
        cols.append([label, f"{flags.get('sharding')}, {world} ranks", f"{ledger['sharded_total_bytes']:,}",
                     f"{ledger['gathered_bytes']:,}", f"{ledger['peak_gathered_bytes']:,}",
                     str(ledger["max_units_gathered"]), moved("all_gather", ring), moved("reduce_scatter", ring),
                     moved("all_reduce", lambda n: 2 * ring(n)), f"{approx}{sent:,.0f}",
                     f"{ledger['fp8_weight_casts_bytes']:,}" if flags.get("precision") == "fp8" else "—",
                     f"{step.span.dur / 1000.0:.2f}"])
    rows = ["run", "--sharding, ranks", "sharded total (B)", "gathered after the step (B)", "peak gathered (B)",
            "most units gathered", "all-gather: payload (B) in calls; sent per rank", "reduce-scatter: the same",
            "all-reduce: the same", "every collective: sent per rank (B)",
            "FP8 weight casts the Linears keep (B)", "traced step, rank 0 (ms)"]
    out = ["| | " + " | ".join(c[0] for c in cols) + " |", "|---|" + "---:|" * len(cols)]
    for i, name in enumerate(rows[1:], 1):
        out.append(f"| {name} | " + " | ".join(c[i] for c in cols) + " |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", action="append", help="a rank's trace file (repeat for more ranks; the first is drawn)")
    ap.add_argument("--metrics", help="train_vit --metrics JSON Lines file")
    ap.add_argument("--log", help="train_vit's log (for Ψ, the flat parameters and the padding)")
    ap.add_argument("--step", type=int, help="the traced step to draw (default: the first in the trace)")
    ap.add_argument("--width", type=int, default=100, help="timeline columns")
    ap.add_argument("--step-times", nargs="+", metavar="METRICS",
                    help="instead: the median and the fastest step time of each metrics file (steps after the 2nd)")
    ap.add_argument("--index", metavar="INDEX_JSON", help="instead: the flat parameters of a sharded checkpoint")
    ap.add_argument("--compare", nargs="+", metavar="LABEL=DIR",
                    help="instead: runs side by side, each DIR holding t.rank0.json, m.jsonl and train.log")
    args = ap.parse_args()
    if args.compare:
        print(compare_figure([tuple(a.split("=", 1)) for a in args.compare]))
        return
    if args.index:
        print(flats_figure(args.index))
        return
    if args.step_times:
        print("| metrics | steps | median step (ms) | fastest step (ms) |\n|---|---:|---:|---:|")
        for path in args.step_times:
            times = sorted(m["step_ms"] for m in read_metrics(path) if m.get("event") == "step" and m["step"] > 2)
            median = (times[(len(times) - 1) // 2] + times[len(times) // 2]) / 2
            print(f"| {path} | {len(times)} | {median:.1f} | {times[0]:.1f} |")
        return
    if not args.trace or not args.metrics:
        ap.error("--trace and --metrics are required (or --step-times)")
    metrics = read_metrics(args.metrics)
    start = next((m for m in metrics if m.get("event") == "start"), {})
    log = read_log(args.log) if args.log else None
    world = int(start.get("flags", {}).get("world_size", 0)) or (log or {}).get("world") or 1
    gather_bytes = DTYPE_BYTES.get((log or {}).get("gather_dtype"), 2)
    reduce_bytes = DTYPE_BYTES.get((log or {}).get("reduce_dtype"), 2)
    flags = start.get("flags", {})
    shards = 1 if flags.get("sharding") == "none" else world  # NO_SHARD pads nothing
    multiple = shards * min(gather_bytes, reduce_bytes)  # a flat's bytes are a multiple of this
    step_name = f"step {args.step}" if args.step else None
    spans = read_trace(args.trace[0])
    step = Step(spans, step_name, multiple)
    step_no = int(step.span.name.split(" ")[1])
    steps = [m for m in metrics if m.get("event") == "step" and "memory_ledger" in m]
    chosen = [m for m in steps if m.get("step") == step_no] or steps[-1:]
    ledger = chosen[0]["memory_ledger"] if chosen else None
    print(f"<!-- generated by tools/fsdp_figures.py from {', '.join(args.trace)}, {args.metrics}"
          + (f", {args.log}" if args.log else "") + " -->")
    print(f"Run: `{flags.get('model', '?')}`, {world} ranks, --sharding {flags.get('sharding', '?')}, "
          f"--precision {flags.get('precision', '?')}, --batch-size {flags.get('batch_size', '?')} per rank"
          + (f"; {log['how']}, {log['flats']} flat parameters" if log and "how" in log else "") + ".")
    print(f"Drawn: {step.span.name} of {args.trace[0].rsplit('/', 1)[-1]}, {fmt_ms(step.span.dur / 1000.0)} ms.\n")
    print("### (a) The FSDP events of one step\n")
    print(events_table(step))
    print("\n" + waits_summary(step))
    if step.unmatched_gathers:
        print(f"\n{len(step.unmatched_gathers)} all-gathers on the comm track belong to no gather span "
              f"(a prefetch that was released unused).")
    if step.launches and not step.scatter_of:
        print("\nThe reduce-scatter launches and the comm track's reduce-scatters (or NO_SHARD's all-reduces) differ "
              "in number: not matched.")
    print("\n### (b) Timeline\n")
    print(timeline(step, args.width))
    print("\nRows: `pass` F forward, B backward, o outside both (optimizer, logging); `compute` the module "
          "computing (digit k = blocks.k, r = a module of the root unit, · = inside the pass but in no module "
          "span); `fsdp gather` from issue to ready; `fsdp wait` the part of it compute was blocked on; `fsdp free` "
          "and `fsdp rs launch` the moments; `fsdp rs wait` where backward waited for that unit's reduce-scatter "
          "(rebuilt, see above); `comm` rows the collectives as the communication thread ran them, by unit; "
          "`comm other` (*) other collectives; `units gathered` the non-root units gathered.")
    print("\n### (c) Units gathered\n")
    print(gathered_figure(step, ledger))
    if ledger:
        print("\n### (d) Memory ledger\n")
        print(ledger_figure(ledger, chosen[0]["step"], start, log, world))
    print("\n### (e) Communication in the step\n")
    print(volume_figure(step, world, log, flags.get("sharding")))
    if len(args.trace) > 1:
        print(f"\n### (f) {step.span.name} on every rank\n")
        print("| trace | step (ms) | forward (ms) | forward outside module spans (ms) | forward waited for gathers (ms) | "
              "forward per block (ms) | backward (ms) | backward waited for gathers (ms) | "
              "backward waited for reduce-scatters (ms) | backward per block (ms) | comm track busy (ms) | max units gathered |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for path in args.trace:
            print(rank_line(path, step.span.name, multiple))


if __name__ == "__main__":
    main()
