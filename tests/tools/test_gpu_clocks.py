#!/usr/bin/env python3
"""tools/gpu_clocks.py on samples and logs written here the way nvidia-smi, bench_vit and
bench/pytorch_reference.py write them: only the samples inside a run's timed steps count."""
import datetime
import json
import os
import subprocess
import sys
import tempfile
import unittest

CLOCKS = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "gpu_clocks.py")
FIELDS = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"
T0 = 1_800_000_000.0  # a moment in 2027, seconds since the epoch


def stamp(t):
    return datetime.datetime.fromtimestamp(t).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


class GpuClocks(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        rows = [f"# nvidia-smi --query-gpu={FIELDS} --format=csv,noheader,nounits -lms 100, every 100 ms"]
        # Before the first run: idle at full clock (must not count).
        rows += [f"{stamp(T0 + 0.1 * i)}, 1980, 3201, 90.5, 35, 0x0000000000000001" for i in range(5)]
        # bench_vit's timed steps, T0+1 to T0+2: 1700-1800 MHz, power-capped on two samples.
        octet = [(1700, 690.0, "0x0000000000000004"), (1750, 700.0, "0x0000000000000004"),
                 (1800, 650.0, "0x0000000000000000")]
        rows += [f"{stamp(T0 + 1.2 + 0.3 * i)}, {c}, 3201, {p}, 61, {r}" for i, (c, p, r) in enumerate(octet)]
        rows += ["garbage line", f"{stamp(T0 + 1.95)}, [N/A], 3201, [N/A], 62, 0x0"]
        # PyTorch's, T0+3 to T0+4: 1900 MHz, nothing holding the clocks.
        rows += [f"{stamp(T0 + 3.1 + 0.2 * i)}, 1900, 3201, 600.0, 58, 0x0000000000000000" for i in range(4)]
        self.samples = self.write("gpu_clocks.csv", "\n".join(rows) + "\n")
        self.bench = self.write("bench_vit_bf16.log", "step 105.10 ms\n" + json.dumps(
            {"bench": "octet", "step_ms": 105.1, "timed_from": T0 + 1.0, "timed_to": T0 + 2.0}) + "\n")
        self.torch = self.write("pytorch_eager.log", "\n".join([
            json.dumps({"bench": "pytorch-eager", "timed_from": T0 + 3.0, "timed_to": T0 + 4.0}),
            json.dumps({"bench": "pytorch-eager-fused", "timed_from": T0 + 9.0, "timed_to": T0 + 10.0}),
            json.dumps({"bench": "pytorch-old", "step_ms": 1.0}),  # no window: not reported
        ]) + "\n")

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def run_clocks(self, *args):
        r = subprocess.run([sys.executable, CLOCKS, *args], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.splitlines()

    def test_each_run_gets_the_samples_inside_its_window(self):
        lines = self.run_clocks(self.samples, self.bench, self.torch)
        self.assertEqual(len(lines), 3, lines)
        bench, eager, fused = lines
        # The N/A sample counts as a sample but gives no SM clock or power: the median of 1700, 1750, 1800.
        self.assertTrue(bench.startswith("bench_vit_bf16: SM clock 1750 MHz median (1700-1800)"), bench)
        self.assertIn("power 690 W median (700 W at most)", bench)
        self.assertIn("62 C at most", bench)
        self.assertIn("over 4 samples", bench)
        self.assertIn("held down by software power cap (2 of 4)", bench)
        self.assertNotIn("idle", bench)  # the idle samples before the run stay out
        self.assertTrue(eager.startswith("pytorch-eager: SM clock 1900 MHz median (1900-1900)"), eager)
        self.assertIn("over 4 samples; nothing held the clocks down", eager)
        self.assertEqual(fused, "pytorch-eager-fused: no clock samples inside its timed steps")

    def test_no_samples_file_is_said_not_failed(self):
        lines = self.run_clocks(os.path.join(self.dir, "missing.csv"), self.bench)
        self.assertEqual(len(lines), 1)
        self.assertTrue(lines[0].startswith("no clock samples:"), lines)

    def test_without_the_reasons_field(self):
        with open(self.samples) as f:
            text = f.read().replace(",clocks_event_reasons.active", "")
        text = "\n".join(l.rsplit(",", 1)[0] if not l.startswith("#") else l for l in text.splitlines())
        samples = self.write("plain.csv", text + "\n")
        bench = self.run_clocks(samples, self.bench)[0]
        self.assertIn("SM clock 1750 MHz median", bench)
        self.assertNotIn("held down", bench)
        self.assertNotIn("nothing held", bench)


if __name__ == "__main__":
    unittest.main()
