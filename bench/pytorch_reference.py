#!/usr/bin/env python3
"""The PyTorch comparator for bench_vit: the same ViT, built directly as timm's VisionTransformer
(ViT-Huge/16 is VisionTransformer(embed_dim=1280, depth=32, num_heads=16)), trained the way the seed
experiment does it (bf16 autocast, SGD momentum 0.9, random data kept on the GPU), eager and under
torch.compile. Each mode times plain SGD, as the seed used it, and SGD(fused=True), the stronger
baseline. It prints the figures bench_vit prints (median step ms, images/s, TFLOP/s, MFU, peak
memory) and one JSON line per run for tools/gpu_check.sh's table.

    python3 bench/pytorch_reference.py --model vit_huge_patch16_224 --batch-size 64 --mode both

--model takes Octet's config names (bench_vit's --model); the model is built from the dimensions
below, never looked up in timm's registry, whose names change between releases.

--start-gate FILE lets a cold torch.compile (minutes for ViT-H) overlap other work and still be
timed on an idle GPU: the script builds, compiles and runs its warm-up steps, prints a line that
begins 'ready:', frees its cached GPU memory, and waits until FILE exists before the timed steps.
tools/gpu_check.sh starts it so, runs the GPU tests meanwhile, then creates FILE.

Nothing in Octet depends on this script or on Python; it runs only beside bench_vit on a GPU machine.
"""
import argparse
import functools
import json
import os
import statistics
import time

STARTED = time.monotonic()
GATE_PASSED = []  # --start-gate is waited for once, before the first timed steps

import timm
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

# Octet's configs (models/vit_configs.cpp) that timm's VisionTransformer builds as they are:
# name -> (img_size, patch_size, embed_dim, depth, num_heads, mlp_ratio).
CONFIGS = {
    "vit_tiny_patch16_224": (224, 16, 192, 12, 3, 4.0),
    "vit_small_patch16_224": (224, 16, 384, 12, 6, 4.0),
    "vit_base_patch16_224": (224, 16, 768, 12, 12, 4.0),
    "vit_large_patch16_224": (224, 16, 1024, 24, 16, 4.0),
    "vit_huge_patch16_224": (224, 16, 1280, 32, 16, 4.0),
}
OPTIMIZERS = {"sgd": "SGD momentum 0.9", "sgd-fused": "SGD momentum 0.9, fused=True"}


def build_model(name, num_classes, gelu="erf"):
    """timm's VisionTransformer; gelu "tanh" gives its MLPs nn.GELU(approximate="tanh"), as bench_vit's
    --gelu tanh (timm's default, "erf", is nn.GELU())."""
    img, patch, dim, depth, heads, mlp_ratio = CONFIGS[name]
    act = functools.partial(torch.nn.GELU, approximate="tanh") if gelu == "tanh" else torch.nn.GELU
    return VisionTransformer(img_size=img, patch_size=patch, embed_dim=dim, depth=depth, num_heads=heads,
                             mlp_ratio=mlp_ratio, num_classes=num_classes, act_layer=act)


def flops_per_image_forward(model):
    """The FLOP count bench_vit uses (models/vit.cpp: flops_per_image_forward): twice the
    multiply-adds of every GEMM and attention matmul of one image's forward."""
    patch = model.patch_embed.patch_size[0]
    img = model.patch_embed.img_size[0]
    in_chans = model.patch_embed.proj.in_channels
    n = (img // patch) ** 2
    t = n + 1
    d = model.embed_dim
    hidden = model.blocks[0].mlp.fc1.out_features
    depth = len(model.blocks)
    per_block = t * d * 3 * d + 2 * t * t * d + t * d * d + 2 * t * d * hidden
    return 2 * (n * in_chans * patch * patch * d + depth * per_block + d * model.num_classes)


def default_peak_tflops(name, precision):
    """NVIDIA's datasheet dense peaks for H100/H200 (as bench_vit's --peak-tflops default)."""
    if "H100" not in name and "H200" not in name:
        return None
    pcie = "PCIe" in name
    if precision == "bf16":
        return 756.0 if pcie else 989.0
    return 51.0 if pcie else 67.0


def run(args, mode):
    """Times one model, eager or compiled, once per optimizer in --optimizer (the compiled model is
    compiled once and shared by both optimizers' runs)."""
    torch.manual_seed(0)
    device = torch.device("cuda")
    with device:  # built and initialised on the GPU: ViT-H's 632M parameters take minutes to initialise on the CPU
        model = build_model(args.model, args.num_classes, args.gelu)
    model.train()
    images = torch.randn(args.batch_size, 3, model.patch_embed.img_size[0], model.patch_embed.img_size[1],
                         device=device)
    labels = torch.arange(args.batch_size, device=device) % model.num_classes
    forward = torch.compile(model) if mode == "compile" else model
    autocast_dtype = torch.bfloat16 if args.precision == "bf16" else None
    name = torch.cuda.get_device_name(device)
    peak = args.peak_tflops if args.peak_tflops is not None else default_peak_tflops(name, args.precision)
    flops_per_image = 3 * flops_per_image_forward(model)
    parameters = sum(p.numel() for p in model.parameters())

    for optimizer_name in (["sgd", "sgd-fused"] if args.optimizer == "both" else [args.optimizer]):
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, fused=optimizer_name == "sgd-fused")

        def step():
            with torch.autocast("cuda", dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss = F.cross_entropy(forward(images), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss

        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        for _ in range(args.warmup):
            step()
        torch.cuda.synchronize(device)
        if args.start_gate and not GATE_PASSED:
            GATE_PASSED.append(True)
            waiting = not os.path.exists(args.start_gate)
            print(f"ready: pytorch-{mode} built, compiled and warmed up {time.monotonic() - STARTED:.0f} s after "
                  f"the start; " + (f"waiting for {args.start_gate} before the timed steps" if waiting else
                                    f"{args.start_gate} exists: timing now"), flush=True)
            if waiting:
                # Give back the cached blocks while others use the GPU (the next step allocates them
                # again, and the median of the timed steps does not see it), and wait for it to be ours.
                torch.cuda.empty_cache()
                waited = time.monotonic()
                while not os.path.exists(args.start_gate):
                    time.sleep(0.2)
                print(f"pytorch-{mode}: {args.start_gate} appeared after {time.monotonic() - waited:.0f} s; timing",
                      flush=True)
        times_ms = []
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        timed_from = time.time()  # the wall clock, to match the steps with the GPU check's clock samples
        for _ in range(args.steps):
            start.record()
            loss = step()
            end.record()
            end.synchronize()
            times_ms.append(start.elapsed_time(end))
        timed_to = time.time()
        last_loss = loss.item()

        step_ms = statistics.median(times_ms)
        images_per_s = args.batch_size / (step_ms / 1e3)
        tflops = flops_per_image * images_per_s / 1e12
        mfu = tflops / peak if peak else None
        peak_memory_gib = torch.cuda.max_memory_allocated(device) / 2**30
        label = (f"pytorch-{mode}" + ("-fused" if optimizer_name == "sgd-fused" else "")
                 + ("-gelu-tanh" if args.gelu == "tanh" else ""))
        print(f"{label}: model {args.model} (timm VisionTransformer), batch {args.batch_size}, {args.precision} "
              f"autocast, {OPTIMIZERS[optimizer_name]}, {name}, {parameters} parameters")
        print(f"{label}: {flops_per_image / 1e9:.4g} GFLOP per training image (3x forward)")
        print(f"{label}: step {step_ms:.2f} ms (median of {args.steps}), {images_per_s:.1f} images/s, "
              f"{tflops:.1f} TFLOP/s" + (f", MFU {100 * mfu:.1f}% of {peak:.0f} TFLOP/s" if mfu else ""))
        print(f"{label}: timed steps: {timed_from:.3f} to {timed_to:.3f} s since the epoch")
        print(f"{label}: memory: peak {peak_memory_gib:.2f} GiB allocated, "
              f"{torch.cuda.max_memory_reserved(device) / 2**30:.2f} GiB reserved")
        print(json.dumps({
            "bench": label, "model": args.model, "device": name, "precision": args.precision, "gelu": args.gelu,
            "optimizer": optimizer_name, "batch_size": args.batch_size, "steps": args.steps, "step_ms": step_ms,
            "images_per_s": images_per_s, "tflops": tflops, "mfu": mfu, "peak_tflops": peak,
            "peak_memory_gib": peak_memory_gib, "gflop_per_image": flops_per_image / 1e9, "loss": last_loss,
            "parameters": parameters, "torch": torch.__version__, "timm": timm.__version__,
            "timed_from": timed_from, "timed_to": timed_to,
        }), flush=True)
        del optimizer, step
        model.zero_grad(set_to_none=True)
    del forward, model, images, labels
    torch.cuda.empty_cache()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_huge_patch16_224", choices=sorted(CONFIGS),
                        help="an Octet config name (bench_vit's --model), built as timm's VisionTransformer")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-classes", type=int, default=1000, help="as Octet's config of the model")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16",
                        help="bf16: torch.autocast(bfloat16) over fp32 parameters; fp32: no autocast")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    parser.add_argument("--gelu", choices=["erf", "tanh"], default="erf",
                        help="the MLPs' GELU: erf (timm's nn.GELU()) or tanh (nn.GELU(approximate='tanh'))")
    parser.add_argument("--mode", choices=["eager", "compile", "both"], default="both")
    parser.add_argument("--optimizer", choices=["sgd", "sgd-fused", "both"], default="both",
                        help="plain SGD (the seed experiment's), SGD(fused=True), or both, one after the other")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak for MFU (default: NVIDIA's datasheet figure for an H100/H200)")
    parser.add_argument("--start-gate", metavar="FILE", default=None,
                        help="after the warm-up steps, print a 'ready:' line and wait until FILE exists before "
                             "timing (lets a cold compile overlap other work and still time an idle GPU)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 runs stay fp32, as Octet's
    for mode in (["eager", "compile"] if args.mode == "both" else [args.mode]):
        run(args, mode)


if __name__ == "__main__":
    main()
