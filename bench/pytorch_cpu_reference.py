#!/usr/bin/env python3
"""The PyTorch comparator for bench_vit on the CPU: timm's VisionTransformer with the dimensions of
Octet's vit_fashion_mnist config, trained as train_vit trains it (f32, AdamW, cross-entropy, batch
128), eager and under torch.compile, on one fixed random batch. It prints the median step time and
images/s per mode, and one JSON line per mode for bench/cpu_vs_pytorch.sh's table.

    python3 bench/pytorch_cpu_reference.py --threads 2 --mode both

Nothing in Octet depends on this script or on Python: bench/cpu_vs_pytorch.sh runs it beside
bench_vit, in the same run, with PyTorch and timm from a virtual environment outside the project.
"""
import argparse
import json
import statistics
import time

import timm
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

# Octet's CPU configs (models/vit_configs.cpp):
# name -> (img_size, patch_size, in_chans, num_classes, embed_dim, depth, num_heads, mlp_ratio).
CONFIGS = {
    "vit_fashion_mnist": (28, 4, 1, 10, 96, 4, 3, 2.0),
}


def build_model(name):
    img, patch, chans, classes, dim, depth, heads, mlp_ratio = CONFIGS[name]
    return VisionTransformer(img_size=img, patch_size=patch, in_chans=chans, num_classes=classes, embed_dim=dim,
                             depth=depth, num_heads=heads, mlp_ratio=mlp_ratio)


def run(args, mode):
    torch.manual_seed(0)
    model = build_model(args.model)
    model.train()
    img, _, chans, classes = CONFIGS[args.model][:4]
    images = torch.randn(args.batch_size, chans, img, img)
    labels = torch.arange(args.batch_size) % classes
    forward = torch.compile(model) if mode == "compile" else model
    # train_vit's defaults: AdamW, weight decay 0.05 (the value does not change the cost).
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)

    def step():
        loss = F.cross_entropy(forward(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    times_ms = []
    for s in range(args.warmup + args.steps):
        start = time.perf_counter()
        loss = step()
        elapsed = time.perf_counter() - start
        if s >= args.warmup:
            times_ms.append(elapsed * 1e3)
    step_ms = statistics.median(times_ms)
    images_per_s = args.batch_size / (step_ms / 1e3)
    label = f"pytorch-{mode}"
    print(f"{label}: model {args.model} (timm VisionTransformer), batch {args.batch_size}, f32, AdamW, "
          f"{torch.get_num_threads()} threads: step {step_ms:.2f} ms (median of {args.steps}), "
          f"{images_per_s:.1f} images/s")
    print(json.dumps({
        "bench": label, "model": args.model, "batch_size": args.batch_size, "threads": torch.get_num_threads(),
        "steps": args.steps, "step_ms": step_ms, "images_per_s": images_per_s, "loss": loss.item(),
        "torch": torch.__version__, "timm": timm.__version__,
    }), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_fashion_mnist", choices=sorted(CONFIGS))
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (intra-op threads)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    parser.add_argument("--mode", default="both", choices=["eager", "compile", "both"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for mode in (["eager", "compile"] if args.mode == "both" else [args.mode]):
        run(args, mode)


if __name__ == "__main__":
    main()
