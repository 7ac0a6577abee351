// The GPU row kernels' prefetch switch (kernels/row_prefetch.h).
#include "kernels/row_prefetch.h"

#include <atomic>

namespace octet::kernels {

namespace {
std::atomic<RowPrefetch> prefetch{RowPrefetch::kRefill};
std::atomic<int64_t> refill_launches{0};
}  // namespace

void set_row_prefetch(RowPrefetch p) { prefetch.store(p, std::memory_order_relaxed); }
RowPrefetch row_prefetch() { return prefetch.load(std::memory_order_relaxed); }
int64_t row_refill_launches() { return refill_launches.load(std::memory_order_relaxed); }
void count_row_refill_launch() { refill_launches.fetch_add(1, std::memory_order_relaxed); }

}  // namespace octet::kernels
