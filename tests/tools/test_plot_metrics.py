#!/usr/bin/env python3
"""tools/plot_metrics.py's pictures, drawn from real train_vit metrics (tests/tools/metrics/) and
checked for what makes them readable in a report:
  - every step axis ticks at whole steps, and all of them span the same steps;
  - a single evaluation sits at its step on that common axis, with an accuracy axis from 0 to 100 %;
  - no legend lies over a panel: each sits outside every panel's plotting area;
  - the panels each run has figures for are there (FP8 amaxes, scales and output error; GPU memory
    and FSDP's ledger), and no others; every panel has a title and its axes are labelled.

The metrics files, from build/bin/train_vit on the CPU (2 threads, seed 1) unless said otherwise:
  short_fp32  --steps 60 --log-every 5 (one evaluation, at the end)
  fp8         --precision fp8 --fp8-log-layer blocks.0.mlp.fc1 --steps 60 --log-every 5 --eval-every 20
  epochs      --epochs 10 --batch-size 64 --warmup-steps 40 --log-every 10, on the first 1,280 training
              and 1,000 test images of Fashion-MNIST (--data-dir): 20 steps an epoch
  gpu_fsdp    --parallel fsdp --precision bf16 --steps 100 --batch-size 64 --seed 7 on one H200 (the first GPU
              run's, 2026-11-27): GPU memory and FSDP's memory ledger in every step event

Needs matplotlib: without it in this python3, the test runs itself again with one that has it, as
plot_metrics.py does, and fails (naming the package) where none has."""
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import plot_metrics  # noqa: E402

METRICS = os.path.join(HERE, "metrics")


def run_of(name):
    return plot_metrics.read_run(os.path.join(METRICS, name + ".jsonl"))


def figure(*names):
    runs = [run_of(n) for n in names]
    labels = [plot_metrics.label_of(n, r) for n, r in zip(names, runs)]
    fig, panels = plot_metrics.make_figure(runs, labels)
    fig.canvas.draw()  # lays the figure out: ticks, legends and extents are final
    return runs, fig, panels


def overlaps(a, b):
    """Whether two display-space boxes share area (touching edges do not count)."""
    return a.x0 < b.x1 - 0.5 and b.x0 < a.x1 - 0.5 and a.y0 < b.y1 - 0.5 and b.y0 < a.y1 - 0.5


class Pictures(unittest.TestCase):
    def tearDown(self):
        import matplotlib.pyplot as plt
        plt.close("all")

    def check_step_axes(self, runs, panels):
        steps = [e["step"] for r in runs for e in r["steps"] + r["evals"]]
        limits = set()
        for name, ax in panels.items():
            if ax.get_xlabel() != "step":
                continue
            low, high = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if low <= t <= high]
            self.assertGreaterEqual(len(ticks), 3, name)
            for t in ticks:
                self.assertEqual(t, round(t), f"{name}: a step tick at {t}")
            self.assertLessEqual(low, min(steps), name)
            self.assertGreaterEqual(high, max(steps), name)
            limits.add((round(low, 6), round(high, 6)))
        self.assertEqual(len(limits), 1, f"the step axes span different steps: {limits}")

    def check_legends_outside(self, fig, panels):
        areas = [ax.get_window_extent() for ax in panels.values()]
        legends = [ax.get_legend() for ax in panels.values() if ax.get_legend()] + list(fig.legends)
        for legend in legends:
            box = legend.get_window_extent()
            for name, area in zip(panels, areas):
                self.assertFalse(overlaps(box, area), f"a legend ({[t.get_text() for t in legend.get_texts()]}) "
                                                      f"covers the {name} panel")
            self.assertGreaterEqual(box.x0, 0)
            self.assertLessEqual(box.x1, fig.bbox.width + 0.5)
            self.assertLessEqual(box.y1, fig.bbox.height + 0.5)

    def check_labels(self, panels):
        for name, ax in panels.items():
            self.assertTrue(ax.get_title(), f"{name} has no title")
            self.assertTrue(ax.get_xlabel() and ax.get_ylabel() or name == "ledger", f"{name} lacks an axis label")

    def test_one_short_run(self):
        runs, fig, panels = figure("short_fp32")
        self.assertEqual(list(panels), ["loss", "lr", "accuracy", "throughput"])
        self.check_step_axes(runs, panels)
        self.check_legends_outside(fig, panels)
        self.check_labels(panels)
        accuracy = panels["accuracy"]
        self.assertEqual(accuracy.get_ylim(), (0, 100), "one evaluation: the whole range of accuracy")
        low, high = accuracy.get_xlim()
        self.assertLessEqual(low, 1)  # not a window of two steps around the evaluation at step 60
        self.assertIn("vit_fashion_mnist", fig._suptitle.get_text())

    def test_few_steps_tick_at_whole_steps(self):
        # The first few steps of a run (no evaluation yet): axes of 3 to 20 steps, where a free locator
        # ticks at 2.5 and 7.5.
        for n in (3, 5, 8, 10, 12, 20):
            run = run_of("short_fp32")
            run["steps"], run["evals"] = run["steps"][:n], []
            fig, panels = plot_metrics.make_figure([run], ["first steps"])
            fig.canvas.draw()
            with self.subTest(steps=n):
                self.check_step_axes([run], panels)

    def test_ten_epochs(self):
        runs, fig, panels = figure("epochs")
        self.assertEqual(len(runs[0]["evals"]), 10)
        self.check_step_axes(runs, panels)
        self.check_legends_outside(fig, panels)
        self.check_labels(panels)
        # The epochs on the loss panel's second axis, at whole epochs.
        secondary = [c for c in panels["loss"].child_axes if c.get_xlabel() == "epoch"]
        self.assertEqual(len(secondary), 1)
        low, high = secondary[0].get_xlim()
        ticks = [t for t in secondary[0].get_xticks() if low <= t <= high]
        self.assertTrue(ticks and all(t == round(t) for t in ticks), ticks)
        self.assertLessEqual(max(ticks), 10)
        self.assertGreaterEqual(max(ticks), 9)
        low, high = panels["accuracy"].get_ylim()
        values = [100 * e["accuracy"] for e in runs[0]["evals"]]
        self.assertTrue(low < min(values) and max(values) < high and high - low < 60, (low, high, values))

    def test_fp8_run(self):
        runs, fig, panels = figure("fp8")
        self.assertEqual(list(panels), ["loss", "lr", "accuracy", "throughput", "amax", "scale", "fp8_error"])
        self.check_step_axes(runs, panels)
        self.check_legends_outside(fig, panels)
        self.check_labels(panels)
        for name in ("amax", "scale"):
            self.assertEqual(panels[name].get_yscale(), "log")
            self.assertEqual(len(panels[name].get_lines()), 3, f"{name}: input, weight and output gradient")
            self.assertIn("blocks.0.mlp.fc1", panels[name].get_title())
        errors = panels["fp8_error"].get_lines()[0].get_ydata()
        self.assertEqual(len(errors), len([e for e in runs[0]["steps"] if "fp8" in e]))
        self.assertTrue(all(0 < v < 20 for v in errors), errors)  # percent: a few, as docs/fp8.md says

    def test_two_runs_compared(self):
        runs, fig, panels = figure("short_fp32", "fp8")
        self.assertIn("amax", panels)
        self.check_step_axes(runs, panels)
        self.check_legends_outside(fig, panels)
        self.check_labels(panels)
        self.assertEqual(len(fig.legends), 1, "one legend names the runs' colours")
        texts = [t.get_text() for t in fig.legends[0].get_texts()]
        self.assertEqual(len(texts), 2)
        self.assertTrue(all("% at step" in t for t in texts), texts)  # each run's last accuracy
        colours = [line.get_color() for line in panels["accuracy"].get_lines()]
        self.assertEqual(len(set(colours)), 2)

    def test_gpu_fsdp_run_has_memory_panels(self):
        runs, fig, panels = figure("gpu_fsdp")
        self.assertIn("gpu_memory", panels)
        self.assertIn("ledger", panels)
        self.check_step_axes(runs, panels)
        self.check_legends_outside(fig, panels)
        self.check_labels(panels)
        labels = [t.get_text() for t in panels["ledger"].get_yticklabels()]
        for kind in ("parameter shards", "gradient shards", "optimizer state"):
            self.assertIn(kind, labels)
        self.assertIn("MiB", panels["gpu_memory"].get_ylabel())

    def test_writes_the_picture(self):
        with tempfile.TemporaryDirectory() as work:
            out = os.path.join(work, "runs.png")
            panels = plot_metrics.draw([run_of("fp8")], ["fp8"], "a title", out)
            with open(out, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            self.assertIn("fp8_error", panels)

    def test_the_files_carry_no_plotting_library_stamp(self):
        # matplotlib writes its version and web address into a file's metadata unless told not to.
        with tempfile.TemporaryDirectory() as work:
            for name in ("runs.png", "runs.pdf", "runs.svg"):
                out = os.path.join(work, name)
                plot_metrics.draw([run_of("fp8")], ["fp8"], "a title", out)
                with open(out, "rb") as f:
                    data = f.read()
                self.assertGreater(len(data), 1000, name)
                at = data.lower().find(b"matplotlib.org")  # (an SVG names the W3C's schemas: those stay)
                self.assertEqual(at, -1, f"{name}: {data[max(at - 40, 0):at + 40]!r}")


if __name__ == "__main__":
    if not plot_metrics.has_matplotlib():
        other = plot_metrics.python_with_matplotlib(
            exclude=[p for p in os.environ.get("OCTET_PLOT_TEST_TRIED", "").split(os.pathsep) if p])
        if other is None:
            sys.exit(f"FAIL: no python3 on PATH has matplotlib; {plot_metrics.INSTALL_HINT}")
        os.environ["OCTET_PLOT_TEST_TRIED"] = other
        os.execv(other, [other, os.path.abspath(__file__)] + sys.argv[1:])
    unittest.main()
