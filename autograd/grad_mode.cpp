// Grad mode: one flag per thread (each simulated rank is a thread and may be
// inside its own no-grad scope).
#include "autograd/grad_mode.h"

namespace tessera::autograd {

namespace {
thread_local bool grad_mode_enabled = true;
}

bool GradMode::is_enabled() { return grad_mode_enabled; }
void GradMode::set_enabled(bool enabled) { grad_mode_enabled = enabled; }

}  // namespace tessera::autograd
