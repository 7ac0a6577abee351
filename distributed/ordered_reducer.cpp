// Buckets released in a fixed order, whatever order their gradients arrive in (distributed/ordered_reducer.h).
#include "distributed/ordered_reducer.h"

#include <utility>

#include "core/error.h"

namespace octet::distributed {

OrderedReducer::OrderedReducer(std::vector<std::vector<std::string>> names, std::string owner)
    : names_(std::move(names)), owner_(std::move(owner)) {
  for (const auto& bucket : names_) arrived_.emplace_back(bucket.size(), false);
  pending_.assign(names_.size(), 0);
}

void OrderedReducer::begin_pass() {
  active_ = true;
  launched_ = 0;
  for (size_t b = 0; b < names_.size(); ++b) {
    arrived_[b].assign(names_[b].size(), false);
    pending_[b] = static_cast<int>(names_[b].size());
  }
}

void OrderedReducer::arrive(int b, int m) {
  OCTET_CHECK(active_, owner_, ": a gradient arrived outside a backward pass; call begin_pass first");
  OCTET_CHECK(!arrived_[b][m], owner_, ": the gradient of ", names_[b][m],
              " arrived twice in one backward pass; each parameter is reduced once per pass");
  arrived_[b][m] = true;
  --pending_[b];
}

std::vector<int> OrderedReducer::take_ready() {
  std::vector<int> ready;
  while (launched_ < buckets() && pending_[launched_] == 0) ready.push_back(launched_++);
  return ready;
}

void OrderedReducer::finish_pass(const std::function<void(int b, int m)>& missing) {
  for (int b = 0; b < buckets(); ++b) {
    for (size_t m = 0; m < arrived_[b].size(); ++m) {
      if (arrived_[b][m]) continue;
      missing(b, static_cast<int>(m));
      arrived_[b][m] = true;
      --pending_[b];
    }
  }
}

}  // namespace octet::distributed
