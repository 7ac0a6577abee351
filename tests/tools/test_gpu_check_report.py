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


# A suite of 8 tests (one DISABLED_, which neither runs nor counts in the sharding) as
# --gtest_list_tests prints it, parameterised names included; and its 2 shards as GoogleTest writes them.
TEST_LIST = """\
Running main() from ./googletest/src/gtest_main.cc
CudaGemm.
  Bf16MatchesF64
  DISABLED_Slow
  Fp8MatchesF64
Shapes/CudaLayerNormFp8.  # TypeParam = float
  EqualsTheUnfusedGpuSequenceBitForBit/0  # GetParam() = 130x1280
  EqualsTheUnfusedGpuSequenceBitForBit/1  # GetParam() = 4097x144
CudaNccl.
  AllReduceAtOneRank
  ReduceScatterAtOneRank
  SplitAtOneRank
"""
# Shard 1 of 2 gets the runnable tests 0, 2, 4, 6 of the list; shard 2 gets 1, 3, 5.
SHARD_FAILS = """\
Running main() from ./googletest/src/gtest_main.cc
Note: This is test shard 1 of 2.
[==========] Running 4 tests from 3 test suites.
[ RUN      ] CudaGemm.Bf16MatchesF64
[       OK ] CudaGemm.Bf16MatchesF64 (3 ms)
[ RUN      ] Shapes/CudaLayerNormFp8.EqualsTheUnfusedGpuSequenceBitForBit/0
x.cpp:85: Failure
[  FAILED  ] Shapes/CudaLayerNormFp8.EqualsTheUnfusedGpuSequenceBitForBit/0, where GetParam() = 130x1280 (589 ms)
[ RUN      ] CudaNccl.AllReduceAtOneRank
[       OK ] CudaNccl.AllReduceAtOneRank (3 ms)
[ RUN      ] CudaNccl.SplitAtOneRank
x.cpp:9: Skipped
needs 2 CUDA devices and this machine has 1
[  SKIPPED ] CudaNccl.SplitAtOneRank (0 ms)
[==========] 4 tests from 3 test suites ran. (600 ms total)
[  PASSED  ] 2 tests.
[  SKIPPED ] 1 test, listed below:
[  SKIPPED ] CudaNccl.SplitAtOneRank
[  FAILED  ] 1 test, listed below:
[  FAILED  ] Shapes/CudaLayerNormFp8.EqualsTheUnfusedGpuSequenceBitForBit/0, where GetParam() = 130x1280

 1 FAILED TEST
gpu_check: exit 1
"""
SHARD_CRASHES = """\
Running main() from ./googletest/src/gtest_main.cc
Note: This is test shard 2 of 2.
[==========] Running 3 tests from 3 test suites.
[ RUN      ] CudaGemm.Fp8MatchesF64
[       OK ] CudaGemm.Fp8MatchesF64 (3 ms)
[ RUN      ] Shapes/CudaLayerNormFp8.EqualsTheUnfusedGpuSequenceBitForBit/1
{ending}"""
# The rerun of what shard 2 never reached.
RERUN = """\
Running main() from ./googletest/src/gtest_main.cc
Note: Google Test filter = CudaNccl.ReduceScatterAtOneRank
[==========] Running 1 test from 1 test suite.
[ RUN      ] CudaNccl.ReduceScatterAtOneRank
[       OK ] CudaNccl.ReduceScatterAtOneRank (2 ms)
[==========] 1 test from 1 test suite ran. (2 ms total)
[  PASSED  ] 1 test.
"""

# An excerpt of a real capture: ncu --clock-control none --metrics gpu__time_duration.sum --csv
# --page raw around one bench_vit step of ViT-H/16 in fp8 on an H200, with the program's own lines
# first, and of ncu's 265 columns only those the summary reads.
NCU_CSV = """\
==WARNING== Note: Running with unmodified GPU clocks. If not controlled otherwise, profiling results may be inconsistent.
==PROF== Connected to process 8863 (/tmp/octet-bundle/bin/bench_vit)
model vit_huge_patch16_224, batch 64, fp8 delayed(margin=0, amax_history_len=1024, amax_compute_algo=max, fp8_format=HYBRID), sgd, cuda:0 (NVIDIA H200), 632199400 parameters
step 27619.42 ms (forward 14127.45, backward 8773.21, optimizer 4718.76; medians of 1)
==PROF== Disconnected from process 8863
"ID","Kernel Name","gpu__time_duration.sum"
"","","ns"
"0","void octet::<unnamed>::convert_direct<float, unsigned short, octet::<unnamed>::F32ToBf16>(const T1 *, T2 *, long, bool, T3)","15,136"
"1","void kernels::<unnamed>::gather_units<uint4, unsigned int>(const T1 *, T1 *, T2, kernels::<unnamed>::Gather<T2>)","11,872"
"2","nvjet_sm90_tst_128x192_64x5_2x1_v_bz_coopB_bias_TNN","41,536"
"6","void kernels::<unnamed>::binary_broadcast<__nv_bfloat16, kernels::<unnamed>::Add, unsigned int>(const T1 *, const T1 *, T1 *, T3, kernels::<unnamed>::StridedIndex<T3, 2>, T2)","72,832"
"7","void octet::<unnamed>::fill_words<unsigned int>(T1 *, T1, long, bool)","1,792"
"8","void octet::<unnamed>::fill_words<unsigned int>(T1 *, T1, long, bool)","1,920"
"11","void kernels::<unnamed>::layernorm_fp8_kernel<__nv_bfloat16, __nv_bfloat16, 1, 0, 0>(const T1 *, const T1 *, T1 *, const T2 *, const T2 *, kernels::<unnamed>::LayerNormFp8Args)","158,304"
"12","void kernels::<unnamed>::fp8_amax_kernel<octet::bfloat16>(const T1 *, long, bool, unsigned int *)","6,464"
"14","void kernels::fp8_cast_kernel<kernels::StoredInput<octet::bfloat16>, 0, 0>(const T1::Element *, const T1::Element *, kernels::CastArgs)","21,056"
"15","nvjet_sm90_qqtst_192x192_128x4_2x1_v_bz_coopB_bias_TNN","101,504"
"16","cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0","82,176"
"21","void kernels::fp8_cast_kernel<kernels::StoredInput<octet::bfloat16>, 0, 0>(const T1::Element *, const T1::Element *, kernels::CastArgs)","61,632"
"39","void kernels::fp8_cast_kernel<kernels::<unnamed>::GeluInput<__nv_bfloat16, 0>, 0, 0>(const T1::Element *, const T1::Element *, kernels::CastArgs)","361,728"
"44","void kernels::<unnamed>::binary_same_shape<__nv_bfloat16, kernels::<unnamed>::Add>(const T1 *, const T1 *, T1 *, long, bool, T2)","22,784"
"77","void kernels::fp8_cast_kernel<kernels::<unnamed>::GeluInput<__nv_bfloat16, 0>, 0, 0>(const T1::Element *, const T1::Element *, kernels::CastArgs)","362,528"
"1226","void kernels::<unnamed>::cross_entropy_rows_kernel<__nv_bfloat16, long>(const T1 *, const T2 *, float *, float *, long, long, float, long)","18,912"
"1228","kernels::<unnamed>::fp8_update_scales_kernel(kernels::<unnamed>::ScalingTable, float, bool)","6,816"
"1231","void kernels::<unnamed>::cross_entropy_grad_scale_kernel<long, float>(const T1 *, long, long, const T2 *, float *)","2,816"
"1235","void cublasLt::globalKernelBgradAB_v1<16, 16, __nv_bfloat16, __nv_bfloat16, float>(int, int, int, const T3 *, int, T4 *, long, long)","2,912"
"1237","void kernels::<unnamed>::layernorm_backward_kernel<__nv_bfloat16, __nv_bfloat16>(const T1 *, const T1 *, const T1 *, const T2 *, const float *, const float *, T1 *, float *, long, long, long, bool, bool)","100,608"
"1238","void kernels::<unnamed>::layernorm_column_sums_kernel<__nv_bfloat16>(const float *, long, long, T1 *, T1 *)","63,680"
"1240","void kernels::<unnamed>::dbias_from_partials_kernel<octet::bfloat16, octet::bfloat16>(const float *, long, long, T2 *)","4,256"
"1243","void kernels::fp8_cast_kernel<kernels::<unnamed>::DgeluInput<__nv_bfloat16, 0>, 1, 1>(const T1::Element *, const T1::Element *, kernels::CastArgs)","371,872"
"1253","void cudnn::compute_dot_do_o<1>(const void *, const void *, void *, void *, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, float, const void *, const void *, const void *, const void *, const void *, bool, const void *, void *, const void *, int, int, int, int, int, int, int, int, int)","37,536"
"1254","cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1_cga1x1x1_kernel0_0","209,376"
"2409","void kernels::<unnamed>::sgd_multi_kernel<float, __nv_bfloat16, __nv_bfloat16, 1>(kernels::<unnamed>::TensorTable<4>, cpu::SgdConstants<T1>)","172,608"
"2410","void kernels::<unnamed>::sgd_multi_kernel<float, __nv_bfloat16, __nv_bfloat16, 1>(kernels::<unnamed>::TensorTable<4>, cpu::SgdConstants<T1>)","172,128"
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

    # -- shards and gtest over several logs
    def shard_logs(self, ending):
        return (self.write("list.txt", TEST_LIST), self.write("s0.log", SHARD_FAILS),
                self.write("s1.log", SHARD_CRASHES.format(ending=ending)))

    def test_shards_names_the_test_a_shard_crashed_in_and_lists_what_it_never_reached(self):
        listing, s0, s1 = self.shard_logs("Segmentation fault (core dumped)\ngpu_check: exit 139\n")
        unreached = os.path.join(self.dir.name, "unreached.txt")
        rc, out = run("shards", listing, s0, s1, "--unreached", unreached)
        self.assertEqual(rc, 0, out)
        # A shard with a failing test ran to the end: it is not called crashed or stuck.
        self.assertIn("s0.log (shard 1 of 2): ran to the end: 2 passed, 1 failed, 1 skipped\n", out)
        self.assertNotIn("s0.log (shard 1 of 2): CRASHED", out)
        self.assertIn("s1.log (shard 2 of 2): CRASHED (exit 139) in "
                      "Shapes/CudaLayerNormFp8.EqualsTheUnfusedGpuSequenceBitForBit/1 after 2 tests of its 3; "
                      "1 never started", out)
        self.assertIn("7 tests listed, 6 started, 1 never started: CudaNccl.ReduceScatterAtOneRank", out)
        with open(unreached) as f:
            self.assertEqual(f.read(), "CudaNccl.ReduceScatterAtOneRank\n")

    def test_shards_tells_a_hang_from_a_crash(self):
        listing, s0, s1 = self.shard_logs("gpu_check: timed out after 150s\n")
        rc, out = run("shards", listing, s0, s1)
        self.assertIn("s1.log (shard 2 of 2): HUNG (timed out after 150 s) in Shapes/CudaLayerNormFp8."
                      "EqualsTheUnfusedGpuSequenceBitForBit/1", out)

    def test_gtest_over_shards_and_a_rerun_names_failures_crashes_and_tests_never_run(self):
        listing, s0, s1 = self.shard_logs("Segmentation fault (core dumped)\ngpu_check: exit 139\n")
        rc, out = run("gtest", s0, s1, "--list", listing, "--gpus", "1", "--free-gib", "70")
        self.assertEqual(rc, 1, out)
        self.assertIn("3 passed, 1 failed, 1 skipped, 1 crashed or hung (1 need more GPUs or memory", out)
        self.assertIn("failed: Shapes/CudaLayerNormFp8.EqualsTheUnfusedGpuSequenceBitForBit/0;", out)
        self.assertIn("did not finish: crashed (exit 139) in Shapes/CudaLayerNormFp8.EqualsTheUnfusedGpuSequenceBitForBit/1 (s1.log)", out)
        self.assertIn("1 listed tests never ran: CudaNccl.ReduceScatterAtOneRank", out)
        # With the rerun, every listed test ran; the failure and the crash still fail the verdict.
        rerun = self.write("rerun.log", RERUN)
        rc, out = run("gtest", s0, s1, rerun, "--list", listing, "--gpus", "1", "--free-gib", "70")
        self.assertEqual(rc, 1, out)
        self.assertNotIn("never ran", out)
        self.assertIn("4 passed", out)
        # Shards that all pass, with the one skip a 1-GPU machine explains: the verdict passes.
        good0 = self.write("g0.log", SHARD_FAILS.replace(
            "x.cpp:85: Failure\n[  FAILED  ] Shapes/CudaLayerNormFp8.EqualsTheUnfusedGpuSequenceBitForBit/0, where GetParam() = 130x1280 (589 ms)",
            "[       OK ] Shapes/CudaLayerNormFp8.EqualsTheUnfusedGpuSequenceBitForBit/0 (589 ms)")
            .split("[  FAILED  ] 1 test, listed below:")[0].replace("[  PASSED  ] 2 tests.", "[  PASSED  ] 3 tests."))
        good1 = self.write("g1.log", SHARD_CRASHES.format(ending=(
            "[       OK ] Shapes/CudaLayerNormFp8.EqualsTheUnfusedGpuSequenceBitForBit/1 (3 ms)\n"
            "[ RUN      ] CudaNccl.ReduceScatterAtOneRank\n[       OK ] CudaNccl.ReduceScatterAtOneRank (2 ms)\n"
            "[==========] 3 tests from 3 test suites ran. (9 ms total)\n[  PASSED  ] 3 tests.\n")))
        rc, out = run("gtest", good0, good1, "--list", listing, "--gpus", "1", "--free-gib", "70")
        self.assertEqual(rc, 0, out)
        self.assertIn("6 passed, 0 failed, 1 skipped (1 need more GPUs or memory than this machine has)", out)
        rc, out = run("gtest", good0, good1, "--list", listing, "--gpus", "2", "--free-gib", "70")
        self.assertEqual(rc, 1, out)  # with 2 GPUs that skip has no excuse

    def test_gtest_fails_a_program_that_left_no_log(self):
        rc, out = run("gtest", os.path.join(self.dir.name, "never.log"), "--gpus", "1")
        self.assertEqual(rc, 1, out)
        self.assertIn("did not finish: never ran (no log)", out)

    def test_gtest_fails_a_log_whose_program_exited_badly_after_its_tests(self):
        log = self.write("e.log", GTEST_LOG.format(skip="", passed=2) + "gpu_check: exit 134\n")
        rc, out = run("gtest", log, "--gpus", "1", "--free-gib", "12")
        self.assertEqual(rc, 1, out)
        self.assertIn("e.log ran its tests but exited 134", out)

    # -- kernels
    def test_kernels_sums_a_capture_by_category_and_by_kernel(self):
        rc, out = run("kernels", self.write("ncu_fp8.csv", NCU_CSV))
        self.assertEqual(rc, 0, out)
        self.assertIn("ncu_fp8.csv: 27 kernel launches, 2.49 ms of GPU time", out)
        lines = {line.split("  ")[1].strip(): line for line in out.splitlines() if line.startswith("  ") and "%" in line}
        # GELU holds the FP8 casts that apply GELU (the fused producers), not the plain casts.
        self.assertRegex(lines["GELU"], r"GELU\s+1\.10\s+44\.1%\s+3$")
        self.assertRegex(lines["FP8 cast/amax"], r"0\.10\s+3\.9%\s+4$")
        self.assertRegex(lines["attention"], r"0\.33\s+13\.2%\s+3$")
        self.assertRegex(lines["GEMM"], r"0\.15\s+5\.9%\s+3$")
        self.assertRegex(lines["LayerNorm"], r"0\.32\s+13\.0%\s+3$")
        self.assertRegex(lines["optimizer"], r"0\.34\s+13\.9%\s+2$")
        self.assertRegex(lines["copies/converts/fills"], r"0\.03\s+1\.2%\s+4$")
        self.assertRegex(lines["loss"], r"0\.02\s+0\.9%\s+2$")
        # The top kernel, by its name without the parameter list: launches and microseconds per launch.
        self.assertRegex(out, r"0\.72\s+2\s+362\.1\s+GELU\s+kernels::fp8_cast_kernel<kernels::GeluInput<__nv_bfloat16, 0>, 0, 0>\n")
        # Another unit in the units row scales the values.
        in_us = NCU_CSV.replace('"","","ns"', '"","","us"')
        rc, out = run("kernels", self.write("us.csv", in_us))
        self.assertIn("us.csv: 27 kernel launches, 2486.78 ms", out)
        # Two captures side by side, and a file that is no capture fails.
        rc, out = run("kernels", self.write("a.csv", NCU_CSV), self.write("b.csv", NCU_CSV))
        self.assertIn("| GELU | 1.10 | 1.10 |", out)
        rc, out = run("kernels", self.write("none.csv", "==PROF== ERR_NVGPUCTRPERM\n"))
        self.assertEqual(rc, 1, out)
        self.assertIn("none.csv: no kernels", out)

    # -- metrics
    def test_metrics_gives_each_kernel_its_bytes_occupancy_waves_and_stalls(self):
        header = ('"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum",'
                  '"dram__throughput.avg.pct_of_peak_sustained_elapsed","sm__warps_active.avg.pct_of_peak_sustained_active",'
                  '"launch__waves_per_multiprocessor","launch__registers_per_thread",'
                  '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",'
                  '"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",'
                  '"smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",'
                  '"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"')
        capture = "\n".join([
            "==PROF== Connected to process 1 (bench_kernels)",
            "profiled: layernorm_backward bf16, dweight+dbias 12608x1280 (96937984 bytes in its budget)",
            header,
            '"","","usecond","Mbyte","Kbyte","%","%","","register/thread","","","",""',
            '"0","void octet::kernels::cuda::<unnamed>::layernorm_backward_rows_kernel<__nv_bfloat16, __nv_bfloat16, 0>'
            '(const T1 *, const T1 *, const T1 *, const T2 *, const float *, const float *, T1 *, float *, long, int, int, '
            'int, bool, bool)","48.80","64.75","34,100","61.2","23.9","0.99","126","21.5","3.2","0.4","1.1"',
            '"1","void octet::kernels::cuda::<unnamed>::layernorm_column_sums_kernel<__nv_bfloat16>(const float *, long, '
            'long, T1 *, T1 *)","3.10","2.69","5.1","","","0.61","28","","","",""',
        ]) + "\n"
        rc, out = run("metrics", self.write("m.csv", capture))
        self.assertEqual(rc, 0, out)
        self.assertIn("| kernel | µs | DRAM read MB | DRAM write MB | DRAM MB | DRAM % of peak |", out)
        # Units converted (Kbyte to MB), thousands separators read, absent columns n/a, the stalls ranked.
        self.assertIn("| layernorm_backward_rows_kernel<__nv_bfloat16, __nv_bfloat16, 0> | 48.8 | 64.8 | 34.1 | n/a | 61.2 | "
                      "n/a | 23.9 | n/a | 1.0 | n/a | n/a | 126.0 | n/a | long_scoreboard 21.5, barrier 3.2, wait 1.1 |", out)
        self.assertIn("| layernorm_column_sums_kernel<__nv_bfloat16> | 3.1 | 2.7 | 0.0 | n/a | n/a |", out)
        self.assertIn("| n/a |\n", out)  # the column sums kernel has no stall figures
        rc, out = run("metrics", self.write("none.csv", "==ERROR== the section is unknown\n"))
        self.assertEqual(rc, 1, out)
        self.assertIn("none.csv: no kernels", out)

    def test_metrics_reads_the_columns_the_sections_alone_give(self):
        # As the 2026-11-28 run's capture had them: DRAM bytes only as a rate, the DRAM share under
        # gpu__, instructions as inst_executed, and the anonymous namespace spelt 'unnamed>::'.
        capture = "\n".join([
            '"ID","Kernel Name","gpu__time_duration.sum","dram__bytes.sum.per_second",'
            '"gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed","inst_executed"',
            '"","","nsecond","Tbyte/s","%","inst"',
            '"0","void unnamed>::layernorm_forward_rows_kernel<__nv_bfloat16, __nv_bfloat16, 0>(const T1 *, int)",'
            '"23,488","1.83","38.16","12,582,784"',
            '"1","void fp8_cast_kernel<unnamed>::GeluInput<__nv_bfloat16, 0>, 0, 0, 1>(const T1::Element *, CastArgs)",'
            '"97,000","2.50","51.5","1,000,000"',
        ]) + "\n"
        rc, out = run("metrics", self.write("s.csv", capture))
        self.assertEqual(rc, 0, out)
        # 1.83 TB/s over 23.488 us = 43.0 MB; 2.50 TB/s over 97 us = 242.5 MB.
        self.assertIn("| layernorm_forward_rows_kernel<__nv_bfloat16, __nv_bfloat16, 0> | 23.5 | n/a | n/a | 43.0 | 38.2 |", out)
        self.assertIn("| 12.6 | n/a |\n", out)
        self.assertIn("| fp8_cast_kernel<GeluInput<__nv_bfloat16, 0>, 0, 0, 1> | 97.0 | n/a | n/a | 242.5 | 51.5 |", out)
        # Other ncu versions spell the rate's seconds out; a unit it does not know gives n/a, not 1 byte/s.
        rc, out = run("metrics", self.write("seconds_spelt.csv", capture.replace('"1.83","38.16"', '"1830","38.16"')
                                                            .replace('"Tbyte/s"', '"Gbyte/second"')))
        self.assertEqual(rc, 0, out)  # 1830 GB/s over 23.488 us = 43.0 MB, as 1.83 TB/s above
        self.assertIn("| layernorm_forward_rows_kernel<__nv_bfloat16, __nv_bfloat16, 0> | 23.5 | n/a | n/a | 43.0 | 38.2 |", out)
        rc, out = run("metrics", self.write("unknown_unit.csv", capture.replace('"Tbyte/s"', '"furlong/fortnight"')))
        self.assertIn("| layernorm_forward_rows_kernel<__nv_bfloat16, __nv_bfloat16, 0> | 23.5 | n/a | n/a | n/a | 38.2 |", out)

    # -- table
    # -- choose
    def test_choose_takes_each_trial_that_won_and_says_why(self):
        step = lambda run, ips, **kw: dict(run=run, bench="octet", images_per_s=ips, step_ms=64000 / ips, **kw)
        bench = self.write("bench.jsonl", "\n".join(json.dumps(r) for r in [
            step("octet", 600.0, precision="bf16"), step("octet-autotune", 610.0, precision="bf16"),
            step("octet-fp8", 830.0, precision="fp8"), step("octet-fp8-autotune", 820.0, precision="fp8"),
            step("octet-bias-epilogue", 590.0, precision="bf16")]) + "\n")  # a step run the kernel rows overrule
        row = lambda kernel, variant, us: json.dumps({"bench": "bench_kernels", "kernel": kernel, "variant": variant,
                                                      "shape": "12608x1280", "us": us, "ratio": 0.7})
        wgrads = lambda name, epilogue, column_sum: self.write(name, "\n".join([
            "kernel   variant   shape   µs   (the text table, not read)",
            row("linear_backward (qkv wgrad)", "bf16, BGRADB epilogue", epilogue[0]),
            row("linear_backward (qkv wgrad)", "bf16, GEMM then column sum", column_sum[0]),
            row("linear_backward (proj wgrad)", "bf16, BGRADB epilogue", epilogue[1]),
            row("linear_backward (proj wgrad)", "bf16, GEMM then column sum", column_sum[1]),
            json.dumps({"bench": "bench_kernels", "summary": True, "worst_ratio": 0.6})]) + "\n")
        # Per block: qkv once, proj's row twice (proj and fc2): 250 + 2 x 100 = 450 with BGRADB against
        # 245 + 2 x 104 = 453 with the column sum, which wins only if proj is counted once.
        rc, out = run("choose", bench, "--kernels", wgrads("bench_kernels.log", (250.0, 100.0), (245.0, 104.0)))
        self.assertEqual(rc, 0, out)
        lines = out.splitlines()
        self.assertEqual(lines[0], "bf16: --autotune on --bias-grad epilogue")
        self.assertEqual(lines[1], "fp8:")
        self.assertIn("why: bf16 --autotune on: 610.0 images/s with it, 600.0 without: taken", out)
        self.assertIn("why: fp8 --autotune on: 820.0 images/s with it, 830.0 without: the default stays", out)
        self.assertIn("why: bf16 --bias-grad epilogue: a block's qkv, proj and fc2 weight gradients 450.0 µs with "
                      "BGRADB, 453.0 with the column sum: taken", out)
        # The column sum winning keeps the default.
        rc, out = run("choose", bench, "--kernels", wgrads("swapped.log", (245.0, 104.0), (250.0, 100.0)))
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.splitlines()[0], "bf16: --autotune on")
        self.assertIn("why: bf16 --bias-grad epilogue: a block's qkv, proj and fc2 weight gradients 453.0 µs with "
                      "BGRADB, 450.0 with the column sum: the default stays", out)

    def test_choose_keeps_the_default_for_a_step_gain_within_its_spread(self):
        step = lambda run, ips: dict(run=run, bench="octet", images_per_s=ips, step_ms=64000 / ips)
        bench = self.write("bench.jsonl", "\n".join(json.dumps(r) for r in [
            step("octet", 600.0), step("octet-autotune", 605.0),  # 0.8% faster: noise
            step("octet-fp8", 830.0), step("octet-fp8-autotune", 839.0)]) + "\n")  # 1.1% faster: taken
        rc, out = run("choose", bench)
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.splitlines()[:2], ["bf16:", "fp8: --autotune on"])
        self.assertIn("why: bf16 --autotune on: 605.0 images/s with it, 600.0 without: the default stays (less than "
                      "the step's 1% spread)", out)
        self.assertIn("why: fp8 --autotune on: 839.0 images/s with it, 830.0 without: taken", out)

    def test_choose_keeps_every_default_when_no_trial_ran(self):
        bench = self.write("bench.jsonl", json.dumps({"run": "octet", "bench": "octet", "images_per_s": 600.0}) + "\n")
        rc, out = run("choose", bench, "--kernels", os.path.join(self.dir.name, "absent.log"))
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.splitlines()[:2], ["bf16:", "fp8:"])
        self.assertIn("why: bf16 --autotune on: not decided, the run with it did not run; the default stays", out)
        self.assertIn("why: fp8 --autotune on: not decided, the run without it did not run; the default stays", out)
        self.assertIn("why: bf16 --bias-grad epilogue: not decided", out)

    def test_table_gives_each_run_the_ratios_and_the_goals(self):
        rows = [
            {"run": "octet", "bench": "octet", "precision": "bf16", "images_per_s": 400.0, "step_ms": 160.0,
             "tflops": 300.0, "mfu": 0.3, "peak_memory_gib": 30.0, "gflop_per_image": 764.0, "steps": 10},
            {"run": "octet-fp8", "bench": "octet", "precision": "fp8", "images_per_s": 500.0, "step_ms": 128.0,
             "tflops": 380.0, "mfu": 0.38, "peak_memory_gib": 28.0, "gflop_per_image": 764.0},
            {"run": "octet-fp8-unfused", "bench": "octet", "precision": "fp8", "images_per_s": 520.0, "step_ms": 123.0,
             "tflops": 395.0, "mfu": 0.4, "peak_memory_gib": 28.0, "gflop_per_image": 764.0},
            {"bench": "pytorch-eager", "precision": "bf16", "images_per_s": 250.0, "step_ms": 256.0, "tflops": 191.0,
             "mfu": 0.19, "peak_memory_gib": 40.0, "gflop_per_image": 764.0},
            {"run": "octet-gelu-tanh", "bench": "octet", "precision": "bf16", "gelu": "tanh", "images_per_s": 420.0,
             "step_ms": 152.4, "tflops": 321.0, "mfu": 0.32, "peak_memory_gib": 30.0, "gflop_per_image": 764.0},
            {"bench": "pytorch-eager-gelu-tanh", "precision": "bf16", "gelu": "tanh", "images_per_s": 260.0,
             "step_ms": 246.2, "tflops": 199.0, "mfu": 0.2, "peak_memory_gib": 40.0, "gflop_per_image": 764.0},
            {"run": "octet-autotune", "bench": "octet", "precision": "bf16", "autotune": True,
             "images_per_s": 440.0, "step_ms": 145.5, "tflops": 330.0, "mfu": 0.33, "peak_memory_gib": 30.1,
             "gflop_per_image": 764.0},
            {"run": "octet-head-start", "bench": "octet", "precision": "bf16", "head_start_ms": 30.0,
             "images_per_s": 410.0, "step_ms": 156.1, "tflops": 307.0, "mfu": 0.31, "peak_memory_gib": 30.0,
             "gflop_per_image": 764.0},
            {"run": "octet-bias-epilogue", "bench": "octet", "precision": "bf16", "bias_grad": "epilogue",
             "images_per_s": 380.0, "step_ms": 168.4, "tflops": 285.0, "mfu": 0.29, "peak_memory_gib": 30.0,
             "gflop_per_image": 764.0},
            {"run": "octet-fp8-chosen", "flags": "--precision fp8 --autotune on", "bench": "octet", "precision": "fp8",
             "images_per_s": 560.0, "step_ms": 114.3, "tflops": 425.0, "mfu": 0.43, "peak_memory_gib": 28.0,
             "gflop_per_image": 764.0},
        ]
        bench = self.write("bench.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
        rc, out = run("table", bench, "--device", "NVIDIA H100", "--model", "vit_huge_patch16_224", "--batch", "64",
                      "--commit", "abc1234", "--date", "2026-11-28")
        self.assertEqual(rc, 0, out)
        self.assertIn("2026-11-28, NVIDIA H100, commit abc1234. vit_huge_patch16_224, batch 64", out)
        self.assertIn("| Octet bf16 (bench_vit) | 400.0 | 160.0 | 300.0 | 30.0% | 30.0 | 1.600 | n/a |", out)
        self.assertIn("| Octet fp8, delayed scaling, --fp8-fused-producers off | 520.0 |", out)
        self.assertIn("| Octet bf16, --recompute blocks | did not run |", out)
        self.assertIn("Octet bf16 ÷ PyTorch eager = 1.600 (goal >= 1.3): met", out)
        self.assertIn("Octet bf16 MFU = 30.0% (goal >= 50%): NOT met (stretch 55%: not met)", out)
        self.assertIn("Octet fp8 ÷ Octet bf16 = 1.250 (goal >= 1.35): NOT met", out)
        self.assertIn("Octet fp8 ÷ PyTorch eager bf16 = 2.000 (goal >= 1.9): met", out)
        self.assertIn("Octet fp8 with the fused producers ÷ with the separate casts = 0.962 (goal > 1): NOT met", out)
        self.assertIn("Octet bf16 peak memory ÷ PyTorch eager's = 0.750 (goal <= 0.8): met", out)
        self.assertIn("| Octet bf16, --gelu tanh (the GELU in cuBLASLt's GEMM epilogues) | 420.0 |", out)
        self.assertIn("bf16 --gelu tanh: 1.050x bf16's (erf) images/s, 1.615x PyTorch eager with the same GELU", out)
        self.assertIn("| Octet bf16, --autotune on | 440.0 | 145.5 | 330.0 | 33.0% | 30.1 | 1.760 | n/a |", out)
        self.assertIn("bf16 --autotune on: 1.100x bf16's images/s with the libraries' heuristic choices", out)
        self.assertNotIn("fp8 --autotune on:", out)  # its row did not run
        self.assertIn("Octet bf16 --autotune on MFU = 33.0% (goal >= 50%): NOT met", out)
        self.assertNotIn("Octet fp8 --autotune on ÷", out)
        self.assertIn("| Octet bf16, --bias-grad epilogue (cuBLASLt's BGRADB) | 380.0 | 168.4 |", out)
        self.assertIn("bf16 --bias-grad epilogue: 0.950x bf16's images/s with the column sum", out)
        self.assertIn("Octet bf16 --bias-grad epilogue MFU = 29.0% (goal >= 50%): NOT met", out)
        self.assertIn("| Octet bf16, --head-start 30 (the host 30 ms ahead of the GPU) | 410.0 | 156.1 |", out)
        self.assertIn("bf16 with each step held 30 ms while the host queues it (--head-start): step 156.10 ms "
                      "against 160.00, +3.90 ms: the plain run's wait on the host's launches", out)
        self.assertIn("| Octet fp8, fused producers on, the trials' winners together (choose) | 560.0 | 114.3 |", out)
        self.assertIn("fp8 with the trials' winners (--autotune on): 1.120x fp8's images/s with the library's "
                      "defaults", out)
        self.assertIn("Octet fp8 with the trials' winners (--autotune on) ÷ PyTorch eager bf16 = 2.240 (goal >= 1.9): "
                      "met", out)
        # Against the faster of bf16's plain run and its trials' winners (not run here): 560 / 400.
        self.assertIn("Octet fp8 with the trials' winners (--autotune on) ÷ Octet bf16's faster run = 1.400 "
                      "(goal >= 1.35): met", out)
        self.assertNotIn("bf16 with the trials' winners", out)  # its row did not run
        self.assertNotIn("torch.compile =", out)  # no compile run, no ratio against it
        self.assertIn("did not run: octet-recompute, octet-fp8-autotune, octet-chosen, "
                      "pytorch-eager-fused, pytorch-compile, pytorch-compile-fused", out)


if __name__ == "__main__":
    unittest.main()
