// FSDP's units, flat parameters, padding and shards, planned from names and sizes (distributed/fsdp_layout.h).
#include "distributed/fsdp_layout.h"

#include <algorithm>

#include "core/error.h"

namespace octet::distributed {

namespace {

bool inside(const std::string& name, const std::string& module) { return name.rfind(module + ".", 0) == 0; }

struct FlatKey {
  int key = 0;
  bool trainable = true, fp8 = false;
  static FlatKey of(const LayoutParameter& p) { return {p.key, p.trainable, p.fp8}; }
  bool operator==(const FlatKey& o) const { return key == o.key && trainable == o.trainable && fp8 == o.fp8; }
};

}  // namespace

FsdpLayout plan_fsdp_layout(const std::vector<std::string>& wrapped, const std::vector<LayoutParameter>& parameters,
                            int world) {
  OCTET_CHECK(world >= 1, "plan_fsdp_layout: the world size must be at least 1, got ", world);
  FsdpLayout layout;
  layout.units.emplace_back();  // the root
  for (const std::string& name : wrapped) {
    OCTET_CHECK(!name.empty(), "plan_fsdp_layout: the root module cannot be wrapped as a unit of its own");
    const bool nested = std::any_of(layout.units.begin() + 1, layout.units.end(),
                                    [&](const std::string& unit) { return inside(name, unit); });
    if (!nested) layout.units.push_back(name);
  }
  auto unit_of = [&](const std::string& parameter) {
    for (size_t u = 1; u < layout.units.size(); ++u) {
      if (inside(parameter, layout.units[u])) return static_cast<int>(u);
    }
    return 0;
  };
  std::vector<int> unit(parameters.size());
  for (size_t i = 0; i < parameters.size(); ++i) unit[i] = unit_of(parameters[i].name);

  layout.unit_flats.resize(layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u) {
    std::vector<FlatKey> keys;
    for (size_t i = 0; i < parameters.size(); ++i) {
      const FlatKey key = FlatKey::of(parameters[i]);
      if (unit[i] == static_cast<int>(u) && std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
    for (const FlatKey& key : keys) {
      FlatLayout flat{static_cast<int>(u), key.key, key.trainable, key.fp8, {}, {}};  // parameters, offsets below
      for (size_t i = 0; i < parameters.size(); ++i) {
        if (unit[i] != static_cast<int>(u) || !(FlatKey::of(parameters[i]) == key)) continue;
        flat.parameters.push_back(static_cast<int>(i));
        flat.offsets.push_back(flat.numel);
        flat.numel += parameters[i].numel;
      }
      flat.padded = (flat.numel + world - 1) / world * world;
      flat.shard_numel = flat.padded / world;
      layout.unit_flats[u].push_back(static_cast<int>(layout.flats.size()));
      layout.flats.push_back(std::move(flat));
    }
  }
  // Backward finishes the units in reverse (for a model whose units run in registration order): the
  // last unit's flats are reduced first, the root's last.
  for (size_t u = layout.units.size(); u-- > 0;) {
    for (int f : layout.unit_flats[u]) {
      if (layout.flats[f].trainable) layout.reduce_order.push_back(f);
    }
  }
  return layout;
}

}  // namespace octet::distributed
