#pragma once
// FSDP's layout: which units a model splits into, which flat parameters each unit holds, where each
// parameter sits in its flat, how a flat is padded and sharded, and the order flats are
// reduce-scattered in. A pure function of names, sizes and the world size: no tensors, no ranks, so
// it is tested on its own (tests/distributed/test_fsdp_layout.cpp) and every rank computes the same.
#include <cstdint>
#include <string>
#include <vector>

namespace octet::distributed {

// One parameter of the model, in registration order.
struct LayoutParameter {
  std::string name;  // dotted, e.g. "blocks.0.mlp.fc1.weight"
  int64_t numel = 0;
  int key = 0;             // FsdpOptions::flat_param_key: parameters with other keys go to other flats
  bool trainable = true;   // frozen parameters get flats of their own: no gradient, no optimizer state
  bool fp8 = false;        // the weight of an FP8 Linear under fp8_all_gather: a flat of its own
};

struct FlatLayout {
  int unit = 0;  // index into FsdpLayout::units
  int key = 0;
  bool trainable = true, fp8 = false;
  std::vector<int> parameters;   // indices into the planner's input, in flat order
  std::vector<int64_t> offsets;  // each one's first element in the flat
  int64_t numel = 0;
  int64_t padded = 0;       // numel rounded up to a multiple of the world size
  int64_t shard_numel = 0;  // padded / world: rank r owns elements [r·shard_numel, (r+1)·shard_numel)
};

struct FsdpLayout {
  std::vector<std::string> units;               // units[0] is the root (""), then the wrapped modules
  std::vector<std::vector<int>> unit_flats;     // per unit: its flats, in creation order
  std::vector<FlatLayout> flats;
  std::vector<int> reduce_order;                // trainable flats: the last unit's first, the root's last
};

// `wrapped`: the dotted names of the modules the wrap policy picked, in module order; one inside
// another picked module is not a unit of its own. A parameter belongs to the unit whose name
// prefixes it, else to the root. Each unit's parameters form one flat per distinct (key, trainable,
// fp8), in the order the first of each appears; inside a flat, registration order.
FsdpLayout plan_fsdp_layout(const std::vector<std::string>& wrapped, const std::vector<LayoutParameter>& parameters,
                            int world);

}  // namespace octet::distributed
