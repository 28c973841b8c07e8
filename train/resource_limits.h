// The bounds on what `train` and `generate` may ask of this machine: cores,
// memory, ranks, threads and generation length, checked from the flags before
// anything is allocated, so a bad value is refused (or warned about) with a
// message naming the flag instead of swapping, stalling or std::bad_alloc.
// The per-rank memory estimate is analytic: it mirrors what FSDP, the model's
// forward (GPT's or Llama's) and the data loader allocate, and a test holds
// it to the measured peak of real steps.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dist/launch/launch_environment.h"
#include "train/train_config.h"

namespace tessera::train {

// ---- the machine ------------------------------------------------------------------------------

struct MachineResources {
  int cores = 1;
  // nullopt: unknown, treated as unlimited (memory_source says so).
  std::optional<int64_t> available_memory_bytes;
  std::string memory_source;  // where the figure came from, for messages
};

// Cores from std::thread::hardware_concurrency (at least 1); memory from
// MemAvailable in /proc/meminfo (what can be allocated without swapping),
// else sysconf's available pages, else unknown.
MachineResources machine_resources();

// MemAvailable of a /proc/meminfo text, in bytes; nullopt when absent or malformed.
std::optional<int64_t> parse_mem_available(const std::string& meminfo);

// ---- a training run's memory -----------------------------------------------------------------------

// One rank's bytes at the peak of a step (backward's start, where everything
// forward saved is still live), by what holds them, from the config alone:
// sharded_state is fsdp::sharding_plan's per-rank total, which needs a live
// mesh. An upper bound by design: measured peaks are 0.78..0.97 of per_rank()
// (tests/train/test_resource_limits.cpp says why).
struct RankMemoryEstimate {
  int64_t sharded_state = 0;        // parameter, gradient and AdamW m, v shards (model dtype)
  int64_t buffers = 0;              // held whole by every rank, outside FSDP (Llama's RoPE tables)
  int64_t gathered_parameters = 0;  // unsharded parameters live at once (param_dtype)
  int64_t gathered_gradients = 0;   // backward's unsharded gradients and reduce-scatter buffers
  int64_t activations = 0;          // what forward saves for backward, the batch, the logits and their gradient
  int64_t shared_data = 0;          // the token data: held once per process, shared by its ranks
  bool process_per_rank = false;    // mpi: each rank is a process with its own copy of the data

  int64_t per_rank() const;
  // What `ranks` ranks on one machine need; saturates at INT64_MAX for absurd flags.
  int64_t on_machine(int ranks) const;
};

// Allocates nothing and reads only the data files' sizes; throws what
// TrainConfig::validate throws.
RankMemoryEstimate estimate_rank_memory(const TrainConfig& config);

// The ranks sharing this machine: --nproc threads (local backend), or the
// launcher's ranks on this node (mpi).
int ranks_on_machine(const TrainConfig& config, const tessera::dist::LaunchInfo& launch);

// ---- the rules -----------------------------------------------------------------------------------

// Local ranks are threads of one process; past this many, use processes (mpi).
inline constexpr int kMaxLocalRanks = 256;
// Past this fraction of the available memory a run may swap or be killed
// when anything else on the machine grows: a warning.
inline constexpr double kMemoryWarningFraction = 0.8;
// Threads (--threads x ranks) as a multiple of max(cores, ranks), the threads
// that keep every core and every rank busy: above 1 a warning (slower steps),
// above this an error.
inline constexpr int kMaxThreadOversubscription = 4;

// Throws tessera::Error naming the flag, the figure, the limit and what to
// do, for: --nproc above kMaxLocalRanks (local backend); an estimate above
// the available memory; --threads T with T x ranks above
// kMaxThreadOversubscription x max(cores, ranks). Otherwise returns the
// warnings to print: more ranks than cores (they take turns: fine for tests
// and teaching, slow), --threads oversubscribing the cores, memory above
// kMemoryWarningFraction, memory unknown. --threads 0 never oversubscribes by
// itself: it gives each rank max(1, cores / ranks).
std::vector<std::string> check_train_resources(
    const TrainConfig& config, const MachineResources& machine,
    const tessera::dist::LaunchInfo& launch = tessera::dist::detect_launch());

// One line for the start-up banner (without its label): the estimate by
// part, times the ranks, against the available memory.
std::string describe_memory(const RankMemoryEstimate& estimate, int ranks_on_machine,
                            const MachineResources& machine);

// ---- generation ------------------------------------------------------------------------------------

// generate holds every token (uint32) and then prints them as text, up to 4
// bytes a token (\xHH for a byte that is not printable).
inline constexpr int64_t kGenerateBytesPerToken = 8;
// The share of the available memory those buffers may take; the model and
// its activations need the rest.
inline constexpr double kGenerateMemoryFraction = 0.5;

// The largest --max-new-tokens whose buffers fit kGenerateMemoryFraction of
// the available memory after prompts of `prompt_tokens` in all, each of the
// `sequences` prompts continued by that many tokens.
int64_t max_new_tokens_allowed(int64_t prompt_tokens, const MachineResources& machine, int64_t sequences = 1);
// Throws tessera::Error naming --max-new-tokens, its bytes and the largest
// value this machine allows, when max_new_tokens is above that.
void check_generation_length(int64_t prompt_tokens, int64_t max_new_tokens, const MachineResources& machine,
                             int64_t sequences = 1);

}  // namespace tessera::train
