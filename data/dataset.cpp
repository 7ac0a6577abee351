#include "data/dataset.h"

namespace octet::data {

// Out of line so the vtable has one home.
Dataset::~Dataset() = default;

}  // namespace octet::data
