#include "bench/step_schedule.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "tensor/error.h"

namespace bench {

LinkModel h100_nvlink() {
  return {
      .name = "NVLink",
      .bytes_per_second = {450e9, "NVLink 4 on H100 SXM: 18 links x 25 GB/s each way (NVIDIA H100 datasheet: 900 GB/s "
                                  "bidirectional)"},
      .efficiency = {0.80,
                     "assumption: nccl-tests on 8 x H100 SXM report ring bus bandwidths of about 360-370 GB/s for "
                     "all-gather and reduce-scatter at hundreds of MB (all-reduce with NVLink SHARP reaches 460-480, "
                     "which a ring does not use); FSDP's per-block messages are tens of MB"},
      .step_latency = {4e-6,
                       "assumption: NCCL's small-message all-gather on 8 NVLink GPUs takes some 20-30 us, about 4 us "
                       "per ring step"},
      .nccl_sm_fraction = {24.0 / 132.0, "assumption: NCCL runs one CTA per channel, each holding an SM that kernels "
                                         "cannot share (NVIDIA/nccl#689); 16-32 channels on NVSwitch, 24 taken"},
      .host_bytes_per_second = {50e9, "PCIe Gen5 x16: 64 GB/s each way, 80% achievable (assumption)"},
  };
}

LinkModel h100_infiniband() {
  return {
      .name = "InfiniBand",
      .bytes_per_second = {50e9, "one 400 Gb/s NIC a GPU, each way (torchtitan's benchmark hosts: \"400 Gb/s per GPU\")"},
      .efficiency = {0.75, "assumption: nccl-tests across nodes on 400 Gb/s rails report bus bandwidths of about 40 GB/s "
                           "for large all-gathers and reduce-scatters, some 80% of the wire; 75% for tens of MB"},
      .step_latency = {10e-6, "assumption: an RDMA hop between nodes with NCCL's proxy, some 6-10 us a ring step; the "
                              "high end"},
      .nccl_sm_fraction = {8.0 / 132.0, "assumption: NCCL runs fewer channels over the network than over NVSwitch; 8 "
                                        "CTAs, each holding an SM"},
      .host_bytes_per_second = {50e9, "PCIe Gen5 x16: 64 GB/s each way, 80% achievable (assumption)"},
  };
}

std::vector<std::string> describe(const LinkModel& link) {
  const auto line = [](const std::string& what, const std::string& value, const Figure& figure) {
    return fmt::format("{:<22} {:<14} {}", what, value, figure.source);
  };
  return {
      line(fmt::format("{} each way", link.name).c_str(), fmt::format("{:.0f} GB/s", link.bytes_per_second.value / 1e9),
           link.bytes_per_second),
      line("ring bus efficiency", fmt::format("{:.0f}%", 100 * link.efficiency.value), link.efficiency),
      line("ring step latency", fmt::format("{:.1f} us", link.step_latency.value * 1e6), link.step_latency),
      line("SMs NCCL holds", fmt::format("{:.0f}%", 100 * link.nccl_sm_fraction.value), link.nccl_sm_fraction),
      line("PCIe each way", fmt::format("{:.0f} GB/s", link.host_bytes_per_second.value / 1e9),
           link.host_bytes_per_second),
  };
}

double ring_seconds(const LinkModel& link, const std::string& kind, int64_t bytes, int ranks) {
  TESSERA_CHECK(ranks >= 1, "ring_seconds: {} over {} ranks", kind, ranks);
  TESSERA_CHECK(bytes >= 0, "ring_seconds: {} of {} bytes", kind, bytes);
  if (ranks == 1) return 0;
  const double n = ranks, bandwidth = link.bytes_per_second.value * link.efficiency.value;
  const double one_pass = (n - 1) / n * static_cast<double>(bytes) / bandwidth + (n - 1) * link.step_latency.value;
  if (kind == "all_gather_into" || kind == "reduce_scatter_into") return one_pass;
  if (kind == "all_reduce") return 2 * one_pass;  // a reduce-scatter, then an all-gather
  if (kind == "broadcast") return static_cast<double>(bytes) / bandwidth + (n - 1) * link.step_latency.value;
  tessera::fail("ring_seconds: no ring model for collective '{}' (all_gather_into, reduce_scatter_into, all_reduce, "
                "broadcast)",
                kind);
}

namespace {

// The replay's state: which ops are done, what runs, and the clock.
class Replay {
 public:
  Replay(const std::vector<StepOp>& ops, const std::vector<LinkModel>& links) : ops_(ops), links_(links) {
    TESSERA_CHECK(!links.empty(), "step schedule: a replay needs at least one link");
    timing_.start.assign(ops.size(), -1);
    timing_.end.assign(ops.size(), -1);
    timing_.communication_seconds_by_link.assign(links.size(), 0);
    timing_.exposed_seconds_by_link.assign(links.size(), 0);
    remaining_.assign(ops.size(), 0);
    index_events_and_streams();
  }

  StepTiming run() {
    for (;;) {
      pass_zero_time_ops();
      start_ready_work();
      if (running_.empty()) break;
      advance();
    }
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (timing_.end[i] < 0) report_stuck(i);
    }
    double first = std::numeric_limits<double>::infinity(), last = 0;
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (ops_[i].kind != StepOp::Kind::work) continue;
      first = std::min(first, timing_.start[i]);
      last = std::max(last, timing_.end[i]);
      if (ops_[i].engine == Engine::sms) timing_.compute_alone_seconds += ops_[i].seconds;
      if (ops_[i].engine == Engine::link) timing_.collectives_alone_seconds += ops_[i].seconds;
    }
    timing_.step_seconds = std::isfinite(first) ? last - first : 0;
    return timing_;
  }

 private:
  void index_events_and_streams() {
    int64_t host_gate = -1;  // the host wait last given
    for (size_t i = 0; i < ops_.size(); ++i) {
      const StepOp& op = ops_[i];
      gate_.push_back(host_gate);
      if (op.kind == StepOp::Kind::host_wait) {
        host_waits_.push_back(i);
        host_gate = static_cast<int64_t>(i);
        continue;
      }
      TESSERA_CHECK(op.stream >= 0, "step schedule: op {} ('{}') is on no stream", i, op.name);
      if (op.kind == StepOp::Kind::record) {
        TESSERA_CHECK(!record_of_.contains(op.event), "step schedule: event {} is recorded twice (ops {} and {})",
                      op.event, record_of_[op.event], i);
        record_of_[op.event] = i;
      }
      if (op.kind == StepOp::Kind::wait) {
        const auto record = record_of_.find(op.event);
        TESSERA_CHECK(record != record_of_.end(),
                      "step schedule: op {} (stream {}) waits for event {}, which no earlier op records", i,
                      op.stream, op.event);
      }
      if (op.kind == StepOp::Kind::work) {
        TESSERA_CHECK(op.seconds >= 0 && std::isfinite(op.seconds), "step schedule: op {} ('{}') takes {} s", i,
                      op.name, op.seconds);
        TESSERA_CHECK(op.engine != Engine::link || (op.link >= 0 && op.link < static_cast<int>(links_.size())),
                      "step schedule: op {} ('{}') runs on link {}; the replay has links 0 to {}", i, op.name, op.link,
                      links_.size() - 1);
      }
      streams_[op.stream].push_back(i);
    }
    for (auto& [stream, queue] : streams_) head_[stream] = 0;
    for (const StepOp& op : ops_) {
      if (op.kind == StepOp::Kind::host_wait) {
        TESSERA_CHECK(record_of_.contains(op.event), "step schedule: the host waits for event {}, which no op records",
                      op.event);
      }
    }
  }

  bool event_reached(int64_t event) const { return timing_.end[record_of_.at(event)] >= 0; }
  // Whether the host has given op i: it gives nothing after a host wait
  // until that wait (and so every one before it) is passed.
  bool given(size_t i) const { return gate_[i] < 0 || timing_.end[static_cast<size_t>(gate_[i])] >= 0; }

  // Records, waits and host waits take no time: each is passed as soon as
  // what it orders after is done.
  void pass_zero_time_ops() {
    for (bool progressed = true; progressed;) {
      progressed = false;
      while (next_host_wait_ < host_waits_.size()) {
        const size_t i = host_waits_[next_host_wait_];
        if (!given(i) || !event_reached(ops_[i].event)) break;
        timing_.start[i] = timing_.end[i] = now_;
        ++next_host_wait_;
        progressed = true;
      }
      for (auto& [stream, queue] : streams_) {
        size_t& head = head_[stream];
        while (head < queue.size()) {
          const size_t i = queue[head];
          const StepOp& op = ops_[i];
          if (op.kind == StepOp::Kind::work || !given(i)) break;
          if (op.kind == StepOp::Kind::wait && !event_reached(op.event)) break;
          timing_.start[i] = timing_.end[i] = now_;
          ++head;
          progressed = true;
        }
      }
    }
  }

  bool engine_busy(Engine engine) const {
    return std::any_of(running_.begin(), running_.end(), [&](size_t i) { return ops_[i].engine == engine; });
  }

  // Each stream's next op, if it is work whose host gate is passed.
  std::vector<size_t> ready_work() const {
    std::vector<size_t> ready;
    for (const auto& [stream, queue] : streams_) {
      const size_t head = head_.at(stream);
      if (head >= queue.size()) continue;
      const size_t i = queue[head];
      if (ops_[i].kind == StepOp::Kind::work && timing_.start[i] < 0 && given(i)) ready.push_back(i);
    }
    std::sort(ready.begin(), ready.end());  // the host's order
    return ready;
  }

  void start_ready_work() {
    for (const size_t i : ready_work()) {
      const Engine engine = ops_[i].engine;
      if (engine != Engine::link && engine_busy(engine)) continue;  // the SMs and copy engines: one at a time
      timing_.start[i] = now_;
      remaining_[i] = ops_[i].seconds;
      running_.push_back(i);
    }
  }

  // The rate at which each running op progresses, in seconds of its work per
  // second; `collectives` holds the number running on each link.
  double rate(size_t i, const std::vector<int>& collectives) const {
    switch (ops_[i].engine) {
      case Engine::link: return 1.0 / collectives[static_cast<size_t>(ops_[i].link)];
      case Engine::sms: {
        double taken = 0;
        for (size_t l = 0; l < links_.size(); ++l) {
          if (collectives[l] > 0) taken += links_[l].nccl_sm_fraction.value;
        }
        return 1.0 - taken;
      }
      default: return 1.0;
    }
  }

  void advance() {
    std::vector<int> collectives(links_.size(), 0);
    for (const size_t i : running_) {
      if (ops_[i].engine == Engine::link) ++collectives[static_cast<size_t>(ops_[i].link)];
    }
    const bool communicating = std::any_of(collectives.begin(), collectives.end(), [](int n) { return n > 0; });
    double step = std::numeric_limits<double>::infinity();
    for (const size_t i : running_) step = std::min(step, remaining_[i] / rate(i, collectives));
    const bool sms = engine_busy(Engine::sms);
    if (sms) timing_.compute_seconds += step;
    if (communicating) timing_.communication_seconds += step;
    if (communicating && !sms) timing_.exposed_seconds += step;
    if (!communicating && !sms) timing_.idle_seconds += step;
    for (size_t l = 0; l < links_.size(); ++l) {
      if (collectives[l] == 0) continue;
      timing_.communication_seconds_by_link[l] += step;
      if (!sms) timing_.exposed_seconds_by_link[l] += step;
    }
    now_ += step;
    std::vector<size_t> still_running;
    for (const size_t i : running_) {
      remaining_[i] -= step * rate(i, collectives);
      if (remaining_[i] <= 1e-15 * std::max(1.0, ops_[i].seconds)) {
        timing_.end[i] = now_;
        ++head_[ops_[i].stream];
      } else {
        still_running.push_back(i);
      }
    }
    running_ = std::move(still_running);
  }

  [[noreturn]] void report_stuck(size_t i) const {
    for (const auto& [stream, queue] : streams_) {
      const size_t head = head_.at(stream);
      if (head >= queue.size()) continue;
      const StepOp& op = ops_[queue[head]];
      if (op.kind == StepOp::Kind::wait && !event_reached(op.event)) {
        tessera::fail("step schedule: stream {} stops at op {} ('{}'), a wait for event {}, which op {} on stream {} "
                      "records and never reaches",
                      stream, queue[head], op.name, op.event, record_of_.at(op.event),
                      ops_[record_of_.at(op.event)].stream);
      }
    }
    tessera::fail("step schedule: op {} ('{}') never runs: the host wait before it (op {}) is never passed", i,
                  ops_[i].name, gate_[i]);
  }

  const std::vector<StepOp>& ops_;
  const std::vector<LinkModel>& links_;
  StepTiming timing_;
  std::vector<double> remaining_;
  std::vector<int64_t> gate_;                 // per op: the host wait last given before it, or -1
  std::vector<size_t> host_waits_;            // in the host's order
  std::map<int64_t, size_t> record_of_;       // event -> the op recording it
  std::map<int, std::vector<size_t>> streams_;  // stream -> its ops in order
  std::map<int, size_t> head_;                // stream -> its first op not passed
  std::vector<size_t> running_;
  size_t next_host_wait_ = 0;
  double now_ = 0;
};

}  // namespace

StepTiming replay(const std::vector<StepOp>& ops, const std::vector<LinkModel>& links) {
  return Replay(ops, links).run();
}

StepTiming replay(const std::vector<StepOp>& ops, const LinkModel& link) {
  return replay(ops, std::vector<LinkModel>{link});
}

}  // namespace bench
