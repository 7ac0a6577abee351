#pragma once
// The grad-mode guards, where autograd users look for them. They live in core so that core's own
// tensor methods can consult the mode.
#include "core/grad_mode.h"

namespace octet::autograd {
using octet::EnableGradGuard;
using octet::GradMode;
using octet::NoGradGuard;
}  // namespace octet::autograd
