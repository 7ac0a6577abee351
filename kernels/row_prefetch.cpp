// The GPU row kernels' prefetch switch (kernels/row_prefetch.h).
#include "kernels/row_prefetch.h"

#include <atomic>

namespace octet::kernels {

namespace {
std::atomic<RowPrefetch> prefetch{RowPrefetch::kRefill};
}  // namespace

void set_row_prefetch(RowPrefetch p) { prefetch.store(p, std::memory_order_relaxed); }
RowPrefetch row_prefetch() { return prefetch.load(std::memory_order_relaxed); }

}  // namespace octet::kernels
