// Whether ops record the autograd graph on this thread. NoGradGuard turns
// recording off for a scope (optimizer steps, FSDP's copy-in/out, eval).
// The flag itself lives in the tensor layer (tensor/raw_op_guard.h), because
// the raw ops read it too: with grad mode on they refuse inputs that require
// grad, so NoGradGuard is also how to run raw ops on parameters on purpose.
#pragma once

#include "tensor/raw_op_guard.h"

namespace tessera::autograd {

class GradMode {
 public:
  static bool is_enabled() { return grad_mode_enabled(); }
  static void set_enabled(bool enabled) { set_grad_mode_enabled(enabled); }
};

class NoGradGuard {
 public:
  NoGradGuard() : previous_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Sets grad mode for a scope either way: e.g. on, to record a recomputation
// inside a backward hook (the engine runs hooks with recording off).
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : previous_(GradMode::is_enabled()) { GradMode::set_enabled(enabled); }
  ~GradModeGuard() { GradMode::set_enabled(previous_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace tessera::autograd
