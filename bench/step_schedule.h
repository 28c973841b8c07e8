// bench/step_schedule: replays one device's schedule (the operations its
// streams were given, with the events and host waits between them, as the
// simulator records them: tensor/cuda/sim/schedule_recorder.h) on a timing
// model, for a PREDICTED step time and how much of it is communication no
// computation hides.
//
// The model, each part an assumption stated where it is used:
// - Kernels, GEMMs and device-to-device copies share the SMs: one at a time,
//   in the order they become ready (ties: the host's order). A GPU can run
//   small kernels of two streams at once; one at a time never predicts less.
// - Collectives run on the links beside them (NCCL's own SMs). While any is
//   running, the kernels get only the SMs NCCL leaves (`nccl_sm_fraction` of
//   each link with a collective running). Concurrent collectives on one link
//   share its bandwidth equally; collectives on different links (NVLink
//   inside a node, InfiniBand between nodes) do not slow each other.
// - A collective's time is the ring model's: an all-gather or reduce-scatter
//   of S bytes over N ranks moves (N - 1) / N S bytes through each rank's
//   link, in N - 1 steps of one latency each; an all-reduce twice that.
// - Copies between host and device take their direction's copy engine.
// - The host is never the bottleneck: it gives work ahead of the streams,
//   except after a host wait, which holds back everything it gives later
//   until the record waited for is reached.
// - Every rank runs the same schedule, so a collective starts when this
//   rank's stream reaches it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/gpu_roofline.h"

namespace bench {

// What an operation occupies while it runs.
enum class Engine { sms, link, host_to_device, device_to_host };

struct StepOp {
  enum class Kind { work, record, wait, host_wait };
  Kind kind = Kind::work;
  int stream = -1;      // work, record, wait
  int64_t event = -1;   // record: its id; wait, host_wait: the record's id
  Engine engine = Engine::sms;
  double seconds = 0;   // work: its time with the engine to itself
  std::string name;
  int link = 0;         // link work: which of the replay's links it runs on
};

// A link and NCCL on it, with the sources of each figure.
struct LinkModel {
  std::string name;          // "NVLink", "InfiniBand"; named in reports
  Figure bytes_per_second;   // per direction per GPU, peak
  Figure efficiency;         // the fraction of it a large ring collective reaches (NCCL's bus bandwidth)
  Figure step_latency;       // seconds per ring step
  Figure nccl_sm_fraction;   // the SMs a running collective takes from the kernels
  Figure host_bytes_per_second;  // PCIe, each direction
};

// 8 x H100 SXM on NVSwitch (NVLink 4).
LinkModel h100_nvlink();
// Between H100 nodes: one 400 Gb/s RDMA NIC a GPU (a rail-optimised
// InfiniBand or RoCE fabric, as Meta's Grand Teton hosts that torchtitan's
// published runs used).
LinkModel h100_infiniband();
std::vector<std::string> describe(const LinkModel& link);

// The ring model's seconds for one collective: `kind` as
// dist::collective_name ("all_gather_into", "reduce_scatter_into",
// "all_reduce", "broadcast"), `bytes` the whole buffer, `ranks` the group.
double ring_seconds(const LinkModel& link, const std::string& kind, int64_t bytes, int ranks);

struct StepTiming {
  double step_seconds = 0;            // first start to last end
  double compute_seconds = 0;         // time the SMs ran kernels
  double communication_seconds = 0;   // time a collective ran
  double exposed_seconds = 0;         // time a collective ran and no kernel did
  double idle_seconds = 0;            // time nothing ran (waiting on copies, or a gap)
  // Per link (the index of replay's `links`): time one of its collectives
  // ran, and time one ran while no kernel did.
  std::vector<double> communication_seconds_by_link, exposed_seconds_by_link;
  double compute_alone_seconds = 0;   // the kernels' seconds with the SMs to themselves
  double collectives_alone_seconds = 0;
  std::vector<double> start, end;     // per op (records and waits: when they were passed)
};

// Replays `ops` (in the order the host gave them). A wait on a record that is
// never given, or one given only after the wait, is a tessera::Error naming
// both: the streams could never run past it.
StepTiming replay(const std::vector<StepOp>& ops, const LinkModel& link);
// The same with several links: link work runs on links[op.link]; any other
// index is a tessera::Error naming the op.
StepTiming replay(const std::vector<StepOp>& ops, const std::vector<LinkModel>& links);

}  // namespace bench
