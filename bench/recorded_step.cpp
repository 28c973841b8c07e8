#include "bench/recorded_step.h"

#include <optional>

#include "tensor/stream.h"
#include "train/trainer.h"

namespace bench {

namespace sim = tessera::cuda::sim;

std::vector<sim::ScheduledOp> record_second_step(const tessera::train::TrainConfig& config) {
  std::vector<sim::ScheduledOp> ops;
  std::optional<sim::ScheduleRecording> recording;
  tessera::train::init_distributed(config, [&](const tessera::train::Distributed& distributed) {
    tessera::train::Trainer trainer(config, tessera::train::build_data(config), distributed);
    trainer.train_step();
    tessera::current_stream(distributed.device)->synchronize();
    distributed.world->barrier();  // every rank past step 1: the recording sees step 2 only
    if (distributed.rank() == 0) recording.emplace();
    distributed.world->barrier();
    trainer.train_step();
    tessera::current_stream(distributed.device)->synchronize();
    distributed.world->barrier();
    if (distributed.rank() == 0) ops = recording->device(distributed.device.index);
  });
  return ops;
}

StepOp step_op(const sim::ScheduledOp& op) {
  StepOp out{.stream = op.stream, .event = op.event, .name = op.name};
  switch (op.kind) {
    case sim::ScheduledOp::Kind::record: out.kind = StepOp::Kind::record; break;
    case sim::ScheduledOp::Kind::wait: out.kind = StepOp::Kind::wait; break;
    case sim::ScheduledOp::Kind::host_wait: out.kind = StepOp::Kind::host_wait; break;
    case sim::ScheduledOp::Kind::collective: out.engine = Engine::link; break;
    default: break;
  }
  return out;
}

}  // namespace bench
