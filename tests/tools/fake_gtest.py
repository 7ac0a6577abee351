#!/usr/bin/env python3
"""A stand-in for a GoogleTest program that crashes in one test and hangs in another, so that
tools/gpu_check.sh's tests stage can be rehearsed on the CPU past both (tools/gpu_bundle_check.sh):

    OCTET_CHECK_GTEST=tests/tools/fake_gtest.py FAKE_GTEST_CRASH=Fake.T05 FAKE_GTEST_HANG=Fake.T10 \\
        OCTET_CHECK_SHARD_SECONDS=5 OCTET_GPU_CHECK_DEVICE=cpu bash tools/gpu_check.sh tests

It answers --gtest_list_tests (ignoring the shard variables, as GoogleTest 1.12 does),
--gtest_filter=A:B:..., and GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX (the j-th test to shard
j mod N), and writes GoogleTest's lines: RUN, OK, FAILED (Fake.T03 fails), the shard note and
the summary. The crash is a SIGSEGV the process sends itself; the hang sleeps until killed.
"""
import os
import signal
import sys
import time

TESTS = [f"Fake.T{i:02d}" for i in range(16)]


def main():
    args = sys.argv[1:]
    if "--gtest_list_tests" in args:
        print("Running main() from fake_gtest.py\nFake.")
        for name in TESTS:
            print("  " + name.split(".")[1])
        return 0
    tests = TESTS
    for a in args:
        if a.startswith("--gtest_filter="):
            wanted = set(a.split("=", 1)[1].split(":"))
            tests = [t for t in TESTS if t in wanted]
            print(f"Note: Google Test filter = {a.split('=', 1)[1]}")
    total, index = os.environ.get("GTEST_TOTAL_SHARDS"), os.environ.get("GTEST_SHARD_INDEX")
    if total and index:
        print(f"Note: This is test shard {int(index) + 1} of {total}.")
        tests = [t for j, t in enumerate(tests) if j % int(total) == int(index)]
    print(f"[==========] Running {len(tests)} tests from 1 test suite.", flush=True)
    failed = []
    for name in tests:
        print(f"[ RUN      ] {name}", flush=True)
        if name == os.environ.get("FAKE_GTEST_CRASH"):
            os.kill(os.getpid(), signal.SIGSEGV)
        if name == os.environ.get("FAKE_GTEST_HANG"):
            while True:
                time.sleep(1)
        if name == "Fake.T03":
            print("fake_gtest.py:1: Failure\nthis test fails on purpose")
            print(f"[  FAILED  ] {name} (0 ms)")
            failed.append(name)
        else:
            print(f"[       OK ] {name} (0 ms)")
    print(f"[==========] {len(tests)} tests from 1 test suite ran. (0 ms total)")
    print(f"[  PASSED  ] {len(tests) - len(failed)} tests.")
    if failed:
        print(f"[  FAILED  ] {len(failed)} test, listed below:")
        for name in failed:
            print(f"[  FAILED  ] {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
