// The checked entry point of the random masks: arguments, the value's bits in the mask's dtype (rounded
// on the host, once), and dispatch to kernels/cpu/ or kernels/cuda/.
#include "kernels/random_masks.h"

#include <cmath>
#include <cstring>

#include "core/op_ledger.h"
#include "kernels/cpu/random_masks_cpu.h"
#include "kernels/cuda/random_masks_cuda.h"

namespace octet::kernels {

Tensor keep_mask(const Shape& shape, double keep, double value, DType dtype, Device device, uint64_t seed,
                 uint64_t offset) {
  OCTET_CHECK(keep >= 0.0 && keep <= 1.0, "keep_mask: keep must be a probability in [0, 1], got ", keep);
  OCTET_CHECK(std::isfinite(value), "keep_mask: the kept value must be finite, got ", value);
  for (int64_t d : shape) OCTET_CHECK(d >= 0, "keep_mask: negative extent in shape ", shape);
  // The kept element's bit pattern in `dtype`, as from_vector would round `value`.
  uint64_t pattern = 0;
  convert_elements(&value, DType::f64, &pattern, dtype, 1);
  Tensor mask = empty(shape, dtype, device);
  LedgerOp ledger("keep_mask");
  ledger.write(mask);
  if (mask.numel() == 0) return mask;
  if (device.is_cuda()) {
    cuda::keep_mask(mask, keep, pattern, seed, offset);
  } else {
    cpu::keep_mask(mask.data_ptr(), mask.element_size(), mask.numel(), keep, pattern, seed, offset);
  }
  return mask;
}

}  // namespace octet::kernels
