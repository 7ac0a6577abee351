#!/usr/bin/env python3
"""tools/gpu_check_report.py's verdicts, on logs and metrics written here the way GoogleTest,
train_vit and bench_vit write them. These verdicts decide whether a GPU run passed, so each is
checked to fail where it must."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

REPORT = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "gpu_check_report.py")

GTEST_LOG = """\
[==========] Running 4 tests from 2 test suites.
[ RUN      ] CudaGemm.Bf16MatchesF64
[       OK ] CudaGemm.Bf16MatchesF64 (3 ms)
[ RUN      ] CudaGpuDefects.OpsOnTheSecondGpu
/src/tests/cuda/test_cuda_gpu_defects.cpp:99: Skipped
needs 2 CUDA devices and this machine has 1
[  SKIPPED ] CudaGpuDefects.OpsOnTheSecondGpu (0 ms)
[ RUN      ] CudaGpuDefects.Big
/src/tests/cuda/test_cuda_gpu_defects.cpp:270: Skipped
needs 20 GiB of free device memory; cuda:0 has 12 GiB free
[  SKIPPED ] CudaGpuDefects.Big (0 ms)
[ RUN      ] CudaAttention.Fused
{skip}[       OK ] CudaAttention.Fused (1 ms)
[==========] 4 tests from 2 test suites ran. (10 ms total)
[  PASSED  ] {passed} tests.
"""


def run(*args):
    p = subprocess.run([sys.executable, REPORT, *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


class Report(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def metrics(self, name, losses):
        lines = [json.dumps({"event": "start"})]
        lines += [json.dumps({"event": "step", "step": i + 1, "loss": v}) for i, v in enumerate(losses)]
        return self.write(name, "\n".join(lines) + "\n")

    # -- gtest
    def test_skips_that_need_more_gpus_or_memory_are_allowed_only_then(self):
        log = self.write("a.log", GTEST_LOG.format(skip="", passed=2))
        rc, out = run("gtest", log, "--gpus", "1", "--free-gib", "12")
        self.assertEqual(rc, 0, out)
        self.assertIn("2 passed, 0 failed, 2 skipped", out)
        rc, out = run("gtest", log, "--gpus", "2", "--free-gib", "12")  # it had the GPUs: no excuse
        self.assertEqual(rc, 1, out)
        self.assertIn("OpsOnTheSecondGpu", out)
        rc, out = run("gtest", log, "--gpus", "1", "--free-gib", "40")
        self.assertEqual(rc, 1, out)
        self.assertIn("CudaGpuDefects.Big", out)

    def test_a_skip_without_a_machine_reason_fails_on_a_gpu_machine(self):
        log = self.write("b.log", GTEST_LOG.format(skip="x.cpp:1: Skipped\nno CUDA device on this machine\n", passed=1)
                         .replace("[       OK ] CudaAttention.Fused (1 ms)", "[  SKIPPED ] CudaAttention.Fused (0 ms)"))
        rc, out = run("gtest", log, "--gpus", "1", "--free-gib", "12")
        self.assertEqual(rc, 1, out)
        self.assertIn("CudaAttention.Fused (x.cpp:1: Skipped no CUDA device", out)
        rc, out = run("gtest", log, "--allow-skips")
        self.assertEqual(rc, 0, out)

    def test_failures_and_unfinished_logs_fail(self):
        log = self.write("c.log", GTEST_LOG.format(skip="", passed=1) + "[  FAILED  ] CudaGemm.Bf16MatchesF64 (3 ms)\n")
        rc, out = run("gtest", log, "--gpus", "1", "--free-gib", "12")
        self.assertEqual(rc, 1, out)
        self.assertIn("failed: CudaGemm.Bf16MatchesF64", out)
        rc, out = run("gtest", self.write("d.log", "[ RUN      ] CudaGemm.Bf16MatchesF64\nSegmentation fault\n"))
        self.assertEqual(rc, 1, out)
        self.assertIn("did not finish", out)

    # -- track
    def test_track_holds_within_the_stated_bound_and_fails_beyond_it(self):
        cpu = [2.30, 2.20, 2.10, 2.00, 1.90, 1.80]
        near = [v * (1 + 2**-9) for v in cpu]            # half the bf16 bound at step 1
        far = cpu[:3] + [v * 1.05 for v in cpu[3:]]      # 5% off from step 4: beyond 2^-6
        ref = self.metrics("cpu.jsonl", cpu)
        rc, out = run("track", self.metrics("near.jsonl", near), ref, "--precision", "bf16", "--steps", "6")
        self.assertEqual(rc, 0, out)
        self.assertIn("bit for bit: False", out)
        rc, out = run("track", self.metrics("far.jsonl", far), ref, "--precision", "bf16", "--steps", "6")
        self.assertEqual(rc, 1, out)
        self.assertIn("OUT OF BOUND at step 4", out)
        mid = cpu[:3] + [v * 1.03 for v in cpu[3:]]      # 3% off from step 4: beyond bf16's bound, within fp8's
        rc, out = run("track", self.metrics("mid.jsonl", mid), ref, "--precision", "bf16", "--steps", "6")
        self.assertEqual(rc, 1, out)
        rc, out = run("track", self.metrics("mid8.jsonl", mid), ref, "--precision", "fp8", "--steps", "6")
        self.assertEqual(rc, 0, out)
        rc, out = run("track", self.metrics("short.jsonl", cpu[:4]), ref, "--precision", "bf16", "--steps", "6")
        self.assertEqual(rc, 1, out)
        self.assertIn("step 5 missing", out)

    # -- falls
    def test_falls_needs_the_last_steps_below_085_of_the_first(self):
        rc, out = run("falls", self.metrics("f.jsonl", [2.3 - 0.05 * i for i in range(20)]))
        self.assertEqual(rc, 0, out)
        rc, out = run("falls", self.metrics("g.jsonl", [2.3 - 0.01 * i for i in range(20)]))
        self.assertEqual(rc, 1, out)
        self.assertIn("did not fall", out)

    # -- table
    def test_table_gives_each_run_and_the_ratios(self):
        rows = [
            {"bench": "octet", "precision": "bf16", "images_per_s": 400.0, "step_ms": 160.0, "tflops": 300.0,
             "mfu": 0.3, "peak_memory_gib": 30.0, "gflop_per_image": 764.0},
            {"bench": "octet", "precision": "fp8", "images_per_s": 500.0, "step_ms": 128.0, "tflops": 380.0,
             "mfu": 0.38, "peak_memory_gib": 28.0, "gflop_per_image": 764.0},
            {"bench": "pytorch-eager", "precision": "bf16", "images_per_s": 320.0, "step_ms": 200.0, "tflops": 244.0,
             "mfu": 0.25, "peak_memory_gib": 40.0, "gflop_per_image": 764.0},
        ]
        bench = self.write("bench.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
        rc, out = run("table", bench, "--device", "H100", "--model", "vit_huge_patch16_224", "--batch", "64")
        self.assertEqual(rc, 0, out)
        self.assertIn("| Octet bf16 (bench_vit) | 400.0 | 160.0 | 300.0 | 30.0% | 30.0 | 1.250 | n/a |", out)
        self.assertIn("Octet fp8 ÷ Octet bf16 = 1.250", out)
        self.assertIn("peak memory ÷ PyTorch eager's = 0.750", out)
        self.assertIn("did not run: pytorch-compile", out)


if __name__ == "__main__":
    unittest.main()
