// fsdp::OffloadedOptimizerStep: the optimizer step of a CPU-offloaded FSDP
// model, overlapped with the next forward. Under CPUOffloadPolicy the
// optimizer steps host shards on the CPU while the GPU waits; here a host
// thread steps them one FSDP group at a time, in forward order, and each
// group's next copy-in waits only for its own group:
//
//   host thread   step group 0 | step group 1 | step group 2 | ...
//   copy-in                     H2D group 0    H2D group 1    ...
//   compute                                    forward 0      forward 1 ...
//
// so the next forward starts after one group's step instead of the whole
// model's. Each parameter's update is the one optimizer.step() makes, so the
// weights are the same bits. The thread also clears each group's gradients
// once it has stepped them (zero_grad's work: the next backward adds into
// none). FSDP2 runs the whole step first; this is tessera's own.
//
//   fsdp::OffloadedOptimizerStep step(*model, optimizer);
//   for (...) {
//     loss = model->loss(...); autograd::backward(loss);
//     step.wait();       // the previous step's thread (long done by now)
//     clip_grad_norm_(...); optimizer.set_lr(...);
//     step.start();      // returns at once; the next forward overlaps it
//   }
//   step.wait();         // before reading the weights or the optimizer state
//
// Between start() and wait() the caller must not touch the optimizer, the
// gradients or the shards itself; FSDP's own accesses (copy-in, the host
// gradients' accumulation, the state dicts) wait for their group.
#pragma once

#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "nn/module.h"
#include "nn/optim/optimizer.h"

namespace tessera::fsdp {

class FSDPParamGroup;
class FSDPState;

class OffloadedOptimizerStep {
 public:
  // `root`: the module fully_shard was applied to last, every group under
  // CPUOffloadPolicy; `optimizer` steps its parameters. Both must outlive
  // this object.
  OffloadedOptimizerStep(nn::Module& root, optim::Optimizer& optimizer);
  ~OffloadedOptimizerStep();  // waits for a running step (dropping its error)
  OffloadedOptimizerStep(const OffloadedOptimizerStep&) = delete;
  OffloadedOptimizerStep& operator=(const OffloadedOptimizerStep&) = delete;

  // Starts one optimizer step on a host thread and returns. Throws
  // tessera::Error if a step is still running (wait() first).
  void start();
  // Returns once the step has finished; rethrows its error. No-op when none
  // was started.
  void wait();
  bool running() const { return worker_.joinable(); }

  // Tests: called on the host thread after group i (in forward order) has
  // stepped and been released.
  void set_after_group_for_testing(std::function<void(size_t group)> after_group) {
    after_group_ = std::move(after_group);
  }

 private:
  FSDPState& root_state() const;
  std::vector<FSDPParamGroup*> groups_in_forward_order() const;

  nn::Module* root_;
  optim::Optimizer* optimizer_;
  std::vector<FSDPParamGroup*> groups_;  // of the running step, in forward order
  std::thread worker_;
  std::exception_ptr error_;
  std::function<void(size_t)> after_group_;
};

}  // namespace tessera::fsdp
