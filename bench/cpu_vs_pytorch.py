#!/usr/bin/env python3
"""Octet's CPU training step against PyTorch's on the same machine, in the same run.

Both train the vit_fashion_mnist model (timm's VisionTransformer with the same dimensions) in f32
with AdamW at batch 128 and the same thread count, on a fixed random batch. The runs are
interleaved round by round (Octet, PyTorch eager, PyTorch compiled, then again), so that a machine
whose speed drifts during the run slows all three alike; the table gives each one's median over
the rounds and Octet's speed as a multiple of each PyTorch mode.

    python3 bench/cpu_vs_pytorch.py --python /path/to/venv/bin/python --threads 2 --rounds 3

--python is an interpreter with torch and timm (a virtual environment outside the project);
bench_vit comes from --build (default build/).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def run(cmd, env=None):
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="a Python with torch and timm")
    parser.add_argument("--build", default=os.path.join(HERE, "..", "build"), help="Octet's build directory")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    args = parser.parse_args()

    bench_vit = os.path.join(args.build, "bin", "bench_vit")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    images_per_s = {"octet": [], "pytorch-eager": [], "pytorch-compile": []}
    versions = {}
    for r in range(args.rounds):
        octet = json_lines(run([bench_vit, "--device", "cpu", "--model", "vit_fashion_mnist", "--optimizer", "adamw",
                                "--batch-size", str(args.batch_size), "--threads", str(args.threads),
                                "--steps", str(args.steps)], env))[-1]
        images_per_s["octet"].append(octet["images_per_s"])
        torch_runs = json_lines(run([args.python, os.path.join(HERE, "pytorch_cpu_reference.py"), "--threads",
                                     str(args.threads), "--batch-size", str(args.batch_size), "--steps",
                                     str(args.steps), "--mode", "both"], env))
        for t in torch_runs:
            images_per_s[t["bench"]].append(t["images_per_s"])
            versions = {"torch": t["torch"], "timm": t["timm"]}
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in images_per_s.items()),
              flush=True)

    octet = statistics.median(images_per_s["octet"])
    print()
    print(f"vit_fashion_mnist, batch {args.batch_size}, f32, AdamW, {args.threads} threads, median of {args.rounds} "
          f"rounds x {args.steps} steps (torch {versions.get('torch')}, timm {versions.get('timm')})")
    print()
    print("| run | images/s | step ms | Octet ÷ this |")
    print("|---|---|---|---|")
    for name, values in images_per_s.items():
        ips = statistics.median(values)
        print(f"| {name} | {ips:.0f} | {1e3 * args.batch_size / ips:.1f} | {octet / ips:.2f}× |")


if __name__ == "__main__":
    main()
