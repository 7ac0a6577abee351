#!/usr/bin/env python3
"""Writes timm_reference.json, the numbers test_vit_timm_reference.cpp compares Octet's ViT against.

It builds timm's own VisionTransformer (img 16, patch 4, 2 channels, dim 16, depth 2, heads 2,
5 classes), fills every parameter with a closed-form pattern, runs a closed-form input through
it in float64, and writes the logits, the input gradient of sum(logits * r), and a few parameter
gradients to tests/models/timm_reference.json (beside this script), every number in its shortest
round-trip form, so the test reads back exactly the doubles PyTorch computed. The C++ test fills
Octet's model with the same pattern in the same parameter order, so any difference in names,
order, layouts (qkv split, patch feature order) or math shows up as a mismatch.

Run it (needs torch and timm; CPU is enough) and commit the rewritten file:
    python3 -m venv /tmp/venv-timm && /tmp/venv-timm/bin/pip install torch timm
    /tmp/venv-timm/bin/python tests/models/make_timm_reference.py
"""
import json
import pathlib

import torch
import timm
from timm.models.vision_transformer import VisionTransformer

OUTPUT = pathlib.Path(__file__).resolve().parent / "timm_reference.json"

# Element i of the k-th parameter (named_parameters order) is AMPLITUDE * sin(0.37 i + 1.3 k);
# the amplitude keeps attention scores away from uniform so the q·kᵀ path matters.
AMPLITUDE = 0.3


def pattern(numel, k):
    i = torch.arange(numel, dtype=torch.float64)
    return AMPLITUDE * torch.sin(0.37 * i + 1.3 * k)


def values(tensor):
    return tensor.detach().flatten().tolist()


def json_text(fields):
    """The JSON of a flat dict, each list four items to a line. json.dumps writes a float as repr
    does: the shortest text that reads back as the same double."""
    lines = []
    for key, value in fields.items():
        if isinstance(value, list):
            rows = [", ".join(json.dumps(v) for v in value[start:start + 4]) for start in range(0, len(value), 4)]
            text = "[\n    " + ",\n    ".join(rows) + "\n  ]"
        else:
            text = json.dumps(value)
        lines.append(f"  {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main():
    torch.manual_seed(0)
    model = VisionTransformer(img_size=16, patch_size=4, in_chans=2, num_classes=5, embed_dim=16, depth=2,
                              num_heads=2, mlp_ratio=4.0, qkv_bias=True).double().eval()
    named = list(model.named_parameters())
    with torch.no_grad():
        for k, (name, p) in enumerate(named):
            p.copy_(pattern(p.numel(), k).reshape(p.shape))

    n = 2 * 2 * 16 * 16
    images = torch.sin(0.11 * torch.arange(n, dtype=torch.float64) + 0.5).reshape(2, 2, 16, 16)
    images.requires_grad_(True)
    logits = model(images)
    r = torch.cos(0.7 * torch.arange(logits.numel(), dtype=torch.float64) + 0.2).reshape(logits.shape)
    (logits * r).sum().backward()

    params = dict(named)
    fields = {
        "generated_by": f"tests/models/make_timm_reference.py with torch {torch.__version__}, timm {timm.__version__}",
        "note": "regenerate rather than edit; patch_weight_grad holds the first 2 output channels only",
        "parameter_order": [name for name, _ in named],
        "logits": values(logits),
        "image_grad": values(images.grad),
        "cls_token_grad": values(params["cls_token"].grad),
        "qkv_bias_grad": values(params["blocks.0.attn.qkv.bias"].grad),
        "patch_weight_grad": values(params["patch_embed.proj.weight"].grad[:2]),  # first 2 output channels
        "head_weight_grad": values(params["head.weight"].grad),
    }
    OUTPUT.write_text(json_text(fields))
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
