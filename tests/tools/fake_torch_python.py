#!/usr/bin/env python3
"""A stand-in for a python with torch, timm and a GPU, so that tools/gpu_check.sh's PyTorch steps
can be rehearsed on a machine without them (tools/gpu_bundle_check.sh sets OCTET_PYTHON to it):

  - `-c CODE` runs CODE with stand-in torch and timm modules, whose torch sees one GPU;
  - `bench/pytorch_reference.py ARGS` speaks that script's protocol: for each --mode and
    --optimizer, the figure lines and one JSON line (figures made up here, labelled as
    bench_vit's are); --mode compile first "compiles" for FAKE_TORCH_COMPILE_SECONDS (default 2),
    and with --start-gate FILE it then prints the 'ready:' line and waits until FILE exists.

Nothing is measured: this tests the check's handling of the comparator (the gate, the deadline that
cuts a cold compile, the table), never PyTorch.
"""
import json
import os
import sys
import time
import types

STARTED = time.monotonic()


def option(args, name, default):
    return args[args.index(name) + 1] if name in args else default


def main():
    args = sys.argv[1:]
    if args and args[0] == "-c":  # the code runs against stand-in modules: torch sees one GPU
        torch = types.ModuleType("torch")
        torch.cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1)
        torch.__version__ = "fake"
        sys.modules.update(torch=torch, timm=types.ModuleType("timm"))
        exec(args[1], {})
        return 0
    if not args or not args[0].endswith("pytorch_reference.py"):
        print(f"fake_torch_python.py: only -c and bench/pytorch_reference.py, not {args}", file=sys.stderr)
        return 2
    args = args[1:]
    mode, optimizer = option(args, "--mode", "both"), option(args, "--optimizer", "both")
    gate, batch = option(args, "--start-gate", None), int(option(args, "--batch-size", "64"))
    for m in (["eager", "compile"] if mode == "both" else [mode]):
        if m == "compile":
            time.sleep(float(os.environ.get("FAKE_TORCH_COMPILE_SECONDS", "2")))
        if gate:
            waiting = not os.path.exists(gate)
            print(f"ready: pytorch-{m} built, compiled and warmed up {time.monotonic() - STARTED:.0f} s after the "
                  f"start; " + (f"waiting for {gate} before the timed steps" if waiting else f"{gate} exists: timing now"),
                  flush=True)
            while not os.path.exists(gate):
                time.sleep(0.2)
            gate = None
        for o in (["sgd", "sgd-fused"] if optimizer == "both" else [optimizer]):
            label = f"pytorch-{m}" + ("-fused" if o == "sgd-fused" else "")
            step_ms = {"eager": 140.0, "compile": 122.0}[m] - (2.0 if o == "sgd-fused" else 0.0)
            print(f"{label}: step {step_ms:.2f} ms (median of 10), {batch / step_ms * 1e3:.1f} images/s (fake)")
            print(json.dumps({"bench": label, "precision": "bf16", "optimizer": o, "batch_size": batch,
                              "step_ms": step_ms, "images_per_s": batch / step_ms * 1e3, "tflops": 0.0,
                              "mfu": None, "peak_memory_gib": 24.0, "gflop_per_image": 1.0}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
