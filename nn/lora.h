#pragma once
// LoRA (Hu et al., 2021, "Low-Rank Adaptation"): fine-tune a frozen Linear through a trainable
// low-rank update,
//
//   y = x·Wᵀ + b + (alpha / r) · (dropout(x)·Aᵀ)·Bᵀ,      A [r, in], B [out, r],
//
// with A uniform in ±1/sqrt(in) (PyTorch's kaiming_uniform_(a = sqrt(5)), as PEFT initialises it)
// and B zero, so an adapted layer starts out computing exactly what its base computes, and only
// r·(in + out) numbers per layer train.
//
// Names follow Hugging Face PEFT, so adapter files map key for key: the adapter is two bias-free
// Linears, children of the adapted layer, "lora_A" (weight [r, in]) and "lora_B" (weight [out, r]),
// and a Dropout "lora_dropout" (no parameters). PEFT saves "base_model.model.<path>.lora_A.weight";
// ours is "<path>.lora_A.weight".
//
// A Linear is adapted one of two ways:
//  - LoRALinear wraps it. Children: base_layer (the frozen Linear: PEFT's name for the wrapped layer,
//    so a LoRALinear's state dict reads as a PEFT LoRA layer's), lora_A, lora_B, lora_dropout. For a
//    model written with LoRA in mind: register a LoRALinear where the Linear would go and call it.
//  - apply_lora adapts the Linears of a model already built, in place. Models call their Linears
//    through typed handles (MultiheadAttention::qkv, Mlp::fc1, ...), so swapping a registered child
//    for a wrapper would change the names but not what forward() calls. apply_lora therefore leaves
//    each Linear where it is, registers lora_A, lora_B and lora_dropout as its children, and adds the
//    low-rank term in a forward hook. The base weights keep their names (timm's
//    "blocks.0.attn.qkv.weight"), so a pretrained checkpoint loads into the adapted model as it is,
//    and the adapters are "blocks.0.attn.qkv.lora_A.weight".
//
// The adapter takes its base weight's dtype and device when it is made. The adapters are Linears
// with fp8_allowed off: at rank r their GEMMs are too thin for FP8 to pay, and LoRA keeps the update
// in the model's precision. A model re-initialised after adapting (VisionTransformer::init_weights
// visits every Linear) loses the zero B; adapt after initialising or loading.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/random.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace octet::nn {

struct LoRAOptions {
  int64_t rank = 8;   // r: 1 <= r <= min(in, out)
  double alpha = 16;  // the update is scaled by alpha / r (PEFT's default scaling)
  double dropout = 0; // on the adapter's input only; the base path never sees it
  // Draws A and the dropout masks; default_generator() when null. Must outlive the adapters.
  Generator* generator = nullptr;
};

// A frozen Linear and its adapter: y = base_layer(x) + (alpha / r)·lora_B(lora_A(lora_dropout(x))).
// The constructor freezes base's weight and bias (requires_grad off) and checks the options.
class LoRALinear : public Module {
 public:
  LoRALinear(std::shared_ptr<Linear> base, const LoRAOptions& options);
  Tensor forward(const Tensor& x) override;

  const int64_t rank;
  const double alpha, scaling;  // scaling = alpha / rank
  std::shared_ptr<Linear> base_layer;
  std::shared_ptr<Linear> lora_A;  // weight [rank, in]
  std::shared_ptr<Linear> lora_B;  // weight [out, rank]
  std::shared_ptr<Dropout> lora_dropout;
};

// Which Linears apply_lora adapts: called with each Linear's dotted name ("" for a root Linear).
using LoRAFilter = std::function<bool(const std::string& name, const Linear& linear)>;
// Picks the Linears whose last name segment is one of `names` (PEFT's target_modules):
// lora_targets({"qkv", "proj", "fc1", "fc2"}) picks every ViT block's attention and MLP Linears
// (patch_embed.proj is a convolution, not a Linear, and is never offered).
LoRAFilter lora_targets(std::vector<std::string> names);

// Adapts, in place, every Linear of `root` the filter picks (the adapters' own Linears are never
// offered), then freezes everything but the adapters and the parameters `trainable_suffixes` names
// (mark_only_lora_as_trainable): `apply_lora(vit, {.rank = 8}, lora_targets({"qkv", "proj", "fc1",
// "fc2"}), {"head.weight", "head.bias"})` trains the adapters and the classifier. Returns the adapted
// Linears' dotted names in module order. Everything is checked before anything changes: the options
// against each picked Linear's sizes, that the filter picks something, that no picked Linear is
// adapted already, and that every suffix names a parameter. Adapt before wrapping the model in
// DDP/FSDP or building its optimizer, which take the parameters as they are when they are built.
std::vector<std::string> apply_lora(Module& root, const LoRAOptions& options, const LoRAFilter& filter,
                                    const std::vector<std::string>& trainable_suffixes = {});

// True for the names of adapter weights: "lora_A.weight" or "lora_B.weight", alone or after a '.'.
bool is_lora_parameter_name(const std::string& name);

// Freezes every parameter of `root` except the adapter weights and the parameters whose dotted names
// end in one of `trainable_suffixes` at a name boundary ("head.weight" matches "head.weight" and
// "x.head.weight", not "myhead.weight"): PEFT's mark_only_lora_as_trainable plus modules_to_save.
// A suffix that matches no parameter throws (a typo would otherwise freeze the head silently).
void mark_only_lora_as_trainable(Module& root, const std::vector<std::string>& trainable_suffixes = {});

// The adapter weights of `root` and the parameters `extra_suffixes` name (matched as above), by
// dotted name, detached and sharing storage as Module::state_dict does: what a LoRA fine-tune saves
// (a few MB where the model is hundreds). Throws when `root` holds no adapter.
StateDict lora_state_dict(const Module& root, const std::vector<std::string>& extra_suffixes = {});

// Loads what lora_state_dict saved into a model adapted the same way (same targets, rank and extra
// suffixes; alpha is not in the weights, so pass the one trained with). The keys must be exactly
// lora_state_dict(root, extra_suffixes)'s: a missing or unexpected key, a shape or dtype mismatch
// throws before anything is written. Parameters outside the dict are left as they are.
void load_lora_state_dict(Module& root, const StateDict& state, const std::vector<std::string>& extra_suffixes = {});

}  // namespace octet::nn
