// The machine's cores and memory, the analytic per-rank memory estimate of a
// training run, and the checks of train's and generate's resource flags.
#include "train/resource_limits.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "dist/comm_stats.h"
#include "tensor/error.h"
#include "train/activation_plan.h"
#include "train/corpus.h"

namespace tessera::train {

namespace {

using tessera::DType;

// ---- the machine ----

std::optional<int64_t> available_pages_bytes() {
#ifdef _SC_AVPHYS_PAGES
  const long pages = sysconf(_SC_AVPHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0) return static_cast<int64_t>(pages) * page_size;
#endif
  return std::nullopt;
}

// ---- the estimate ----

// A term of the estimate: figures from absurd flags (--batch 10^15) are
// computed in double and capped, so sums and products of terms cannot overflow.
constexpr double kByteCap = 0x1p57;  // 128 PiB
int64_t capped(double bytes) { return static_cast<int64_t>(std::min(bytes, kByteCap)); }

double size_of(DType dtype) { return static_cast<double>(tessera::element_size(dtype)); }

// A parameter as FSDP shards it: dim-0 rows of row_numel elements.
struct ParamRows {
  int64_t rows;
  int64_t row_numel;
};

// One TransformerBlock (nn/transformer_block.cpp): ln1, attn.qkv, attn.proj, ln2, mlp.fc, mlp.proj.
std::vector<ParamRows> block_parameters(const tessera::nn::GPTConfig& model) {
  const int64_t C = model.n_embd;
  std::vector<ParamRows> params = {{C, 1}, {3 * C, C}, {C, C}, {C, 1}, {4 * C, C}, {C, 4 * C}};
  if (model.bias) params.insert(params.end(), {{C, 1}, {3 * C, 1}, {C, 1}, {C, 1}, {4 * C, 1}, {C, 1}});
  return params;
}

// The root's own parameters (fully_shard(model) after the blocks): wte (also
// the tied head), wpe, ln_f.
std::vector<ParamRows> root_parameters(const tessera::nn::GPTConfig& model) {
  const int64_t C = model.n_embd;
  std::vector<ParamRows> params = {{model.padded_vocab_size(), C}, {model.block_size, C}, {C, 1}};
  if (model.bias) params.push_back({C, 1});
  return params;
}

// One LlamaBlock (nn/models/llama.cpp): attention_norm, attention.{wq, wk,
// wv, wo}, ffn_norm, feed_forward.{w1, w2, w3}; no biases. wk and wv have
// n_kv_head * head_dim rows.
std::vector<ParamRows> block_parameters(const tessera::nn::LlamaConfig& model) {
  const int64_t C = model.n_embd, F = model.ffn_hidden, kv = model.n_kv_head * model.head_dim();
  return {{C, 1}, {C, C}, {kv, C}, {kv, C}, {C, C}, {C, 1}, {F, C}, {C, F}, {F, C}};
}

// The Llama root's own parameters: tok_embeddings, norm, and the output head
// (untied: a matrix of its own).
std::vector<ParamRows> root_parameters(const tessera::nn::LlamaConfig& model) {
  const int64_t C = model.n_embd;
  return {{model.vocab_size, C}, {C, 1}, {model.vocab_size, C}};
}

std::vector<ParamRows> block_parameters(const ModelConfig& model) {
  return std::visit([](const auto& shape) { return block_parameters(shape); }, model);
}

std::vector<ParamRows> root_parameters(const ModelConfig& model) {
  return std::visit([](const auto& shape) { return root_parameters(shape); }, model);
}

// One FSDPParamGroup's sizes in elements over `world` ranks: the same layout
// arithmetic as FSDPParamGroup's make_layout (and plan.cpp's slot_numel_for),
// which need a live group; mirrored here to run before any rank exists.
struct GroupSize {
  int64_t world = 1;
  double numel = 0;  // the unsharded parameters
  double slot = 0;   // one rank's padded shard: sum of ceil(rows / world) * row_numel
  double params = 0;
  double gathered() const { return slot * static_cast<double>(world); }  // one all-gather's output
};

GroupSize group_size(const std::vector<ParamRows>& params, int64_t world) {
  GroupSize size;
  size.world = world;
  for (const ParamRows& param : params) {
    size.numel += static_cast<double>(param.rows) * static_cast<double>(param.row_numel);
    size.slot += static_cast<double>((param.rows + world - 1) / world) * static_cast<double>(param.row_numel);
    size.params += 1;
  }
  return size;
}

// One tp rank's pieces of `params` under --tp (tp/plans.h): a matrix's rows
// or columns split over the tp ranks, taken here as its rows (the same
// elements, ceil's rounding aside); vectors (norms, biases) whole, as the
// replicated ones are and the split biases nearly are.
std::vector<ParamRows> tensor_parallel_pieces(std::vector<ParamRows> params, int64_t tp) {
  for (ParamRows& param : params) {
    if (param.row_numel > 1) param.rows = (param.rows + tp - 1) / tp;
  }
  return params;
}

// The N of reshard_after_forward: S = true, 1 = false.
int64_t post_forward_shards(const TrainConfig& config) {
  return config.reshard_after_forward.shards_after_forward(config.shard_ranks());
}

// Parameters unsharded at backward's start (param_dtype), where the peak is.
// The root is never resharded after forward: whole from its forward to the
// end of backward. Blocks that reshard (N = S > 1): the running one and the
// next one's all-gather output (prefetched). Blocks that do not (false, or
// one shard rank, where N = S = 1): all of them, from their forward to their
// backward. With 1 < N < S, the running two and every block's rows of a
// group-of-N sharding.
double gathered_parameter_bytes(const TrainConfig& config, const GroupSize& root, const GroupSize& block) {
  const double layers = static_cast<double>(n_layer(config.model_config()));
  const int64_t shards = post_forward_shards(config);
  double blocks = 2 * block.numel;
  if (shards == 1) {
    blocks = layers * block.numel;
  } else if (shards != config.shard_ranks()) {
    const std::vector<ParamRows> pieces = tensor_parallel_pieces(block_parameters(config.model_config()), config.tp);
    blocks += layers * group_size(pieces, shards).slot;
  }
  return (root.numel + blocks) * size_of(config.param_dtype);
}

// Backward's gradients before they reach the shards: the root's unsharded
// gradients (the head's is backward's first and lives to its end),
// the running block's (param_dtype), which its reduce-scatter input
// (reduce_dtype) replaces one parameter at a time, and that reduce-scatter's
// output slot plus presence flags. Micro-batches whose gradients are not
// synced (--grad-sync last) keep every group's unsharded gradients until the
// last one.
double gathered_gradient_bytes(const TrainConfig& config, const GroupSize& root, const GroupSize& block) {
  const double p = size_of(config.param_dtype);
  const double r = size_of(config.reduce_dtype.value_or(config.param_dtype));
  const double layers = static_cast<double>(n_layer(config.model_config()));
  const bool accumulates_unsynced =
      config.grad_accum > 1 && config.grad_sync == tessera::fsdp::GradientSync::last_micro_batch;
  const double others = accumulates_unsynced ? root.numel + (layers - 1) * block.numel : root.numel;
  return others * p + block.numel * std::max(p, r) + (block.slot + block.params) * r;
}

// What forward keeps for backward under the run's --ac (train/activation_plan.h,
// exact: fully_shard casts every block's input to param_dtype and the
// embeddings come out in it), plus the batch's inputs and targets (i64),
// backward's first working set (the logits' gradient in the compute dtype
// and, for 16-bit activations, the logits' compute-dtype copy and the
// gradient cast back) and, when a block is checkpointed, the activations
// its recompute brings back for its backward (one block at a time).
double activation_bytes(const TrainConfig& config) {
  const ModelConfig model = config.model_config();
  const ActivationBytes plan = plan_activations(config);
  const double held = static_cast<double>(plan.total + (checkpointed_blocks(config) > 0 ? plan.block : 0));
  const double p = size_of(config.param_dtype);
  const double c = size_of(tessera::compute_dtype(config.param_dtype));
  const double V = static_cast<double>(padded_vocab_size(model));
  const double tokens = static_cast<double>(config.batch) * static_cast<double>(config.seq_len);
  const double logits_gradient = V * c + (p < c ? V * (c + p) : 0.0);
  return held + tokens * (2 * size_of(DType::i64) + logits_gradient);
}

// Buffers every rank holds whole, outside FSDP: a Llama block's RoPE cos and
// sin tables, [block_size, head_dim / 2] each in the model's dtype. A GPT has none.
double buffer_bytes(const tessera::nn::GPTConfig&) { return 0.0; }
double buffer_bytes(const tessera::nn::LlamaConfig& model) {
  return static_cast<double>(model.n_layer) * static_cast<double>(model.block_size) *
         static_cast<double>(model.head_dim()) * size_of(model.dtype);
}

// The bytes of the tokens the data loader will hold (token_stream.h: 2 a
// token, 4 for ids from 65,536), from the files' sizes. With --tokenizer, at
// most one token a byte of text, wide when the tokenizer's vocabulary (the
// model's) is: a bound from above.
double token_data_bytes(const TrainConfig& config) {
  if (config.data == kSyntheticData) return 0.0;
  if (config.data.empty()) {  // the files as rendered (corpus.h), a byte a token
    return static_cast<double>(default_corpus_token_count()) * sizeof(uint16_t);
  }
  const TokenFileSize size = token_size_of_file(config.data);
  const bool wide_text = !config.tokenizer.empty() && vocab_size(config.model_config()) > kNarrowTokenVocab;
  return static_cast<double>(wide_text ? size.tokens * int64_t{sizeof(uint32_t)} : size.bytes);
}

// ---- messages ----

std::string bytes_text(int64_t bytes) { return tessera::dist::human_bytes(bytes); }

std::string plural(int64_t count, const char* noun) {
  return fmt::format("{} {}{}", count, noun, count == 1 ? "" : "s");
}

// The token data on this machine: once, or a copy per (mpi) process.
std::string data_text(const RankMemoryEstimate& estimate, int ranks) {
  const std::string bytes = bytes_text(estimate.shared_data);
  if (!estimate.process_per_rank || ranks == 1) return fmt::format("{} of token data", bytes);
  return fmt::format("{} x {} of token data (a copy per process)", ranks, bytes);
}

// How the user chose the ranks on this machine.
std::string ranks_flag(const TrainConfig& config, int ranks) {
  if (config.backend == "local") return fmt::format("--nproc {}", config.nproc);
  return fmt::format("the launcher's {} on this machine", plural(ranks, "rank"));
}

}  // namespace

// ---- the machine -----------------------------------------------------------------------------------

std::optional<int64_t> parse_mem_available(const std::string& meminfo) {
  std::istringstream lines(meminfo);
  std::string line;
  const std::string key = "MemAvailable:";
  while (std::getline(lines, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream fields(line.substr(key.size()));
    std::string number, unit;
    fields >> number >> unit;
    int64_t kib = 0;
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), kib);
    if (error != std::errc() || end != number.data() + number.size() || kib < 0 || unit != "kB") return std::nullopt;
    if (kib > std::numeric_limits<int64_t>::max() / 1024) return std::nullopt;
    return kib * 1024;
  }
  return std::nullopt;
}

MachineResources machine_resources() {
  MachineResources machine;
  machine.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::ifstream file("/proc/meminfo");
  std::ostringstream text;
  text << file.rdbuf();
  if (auto bytes = parse_mem_available(text.str())) {
    machine.available_memory_bytes = bytes;
    machine.memory_source = "MemAvailable in /proc/meminfo";
  } else if (auto pages = available_pages_bytes()) {
    machine.available_memory_bytes = pages;
    machine.memory_source = "sysconf(_SC_AVPHYS_PAGES)";
  } else {
    machine.memory_source = "unknown: neither /proc/meminfo nor sysconf says";
  }
  return machine;
}

// ---- the estimate ---------------------------------------------------------------------------------------

int64_t RankMemoryEstimate::per_rank() const {
  return sharded_state + buffers + gathered_parameters + gathered_gradients + activations;
}

int64_t RankMemoryEstimate::on_machine(int ranks) const {
  const double copies = process_per_rank ? static_cast<double>(ranks) : 1.0;
  const double total = static_cast<double>(ranks) * static_cast<double>(per_rank()) +
                       copies * static_cast<double>(shared_data);
  if (total >= 0x1p63) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(total);
}

RankMemoryEstimate estimate_rank_memory(const TrainConfig& config) {
  config.validate();
  const ModelConfig model = config.model_config();
  const int64_t shards = config.shard_ranks();
  // Under --tp FSDP shards each tp rank's pieces. The activations are
  // counted as without tensor parallelism: an upper bound (sequence
  // parallelism and the split heads keep less).
  const GroupSize root = group_size(tensor_parallel_pieces(root_parameters(model), config.tp), shards);
  const GroupSize block = group_size(tensor_parallel_pieces(block_parameters(model), config.tp), shards);
  const double layers = static_cast<double>(n_layer(model));
  RankMemoryEstimate estimate;
  // Parameter shards (allocated padded), gradient shards, AdamW's m and v: the model's dtype.
  estimate.sharded_state = capped(4 * (root.slot + layers * block.slot) * size_of(parameter_dtype(model)));
  estimate.buffers = capped(std::visit([](const auto& shape) { return buffer_bytes(shape); }, model));
  estimate.gathered_parameters = capped(gathered_parameter_bytes(config, root, block));
  estimate.gathered_gradients = capped(gathered_gradient_bytes(config, root, block));
  estimate.activations = capped(activation_bytes(config));
  estimate.shared_data = capped(token_data_bytes(config));
  estimate.process_per_rank = config.backend != "local";
  return estimate;
}

int ranks_on_machine(const TrainConfig& config, const tessera::dist::LaunchInfo& launch) {
  if (config.backend == "local") return config.nproc;
  return std::max(1, launch.local_world_size);
}

// ---- the rules ------------------------------------------------------------------------------------------

namespace {

// The estimate against the available memory: an error above it, a warning
// near it or when the available memory is unknown.
void check_memory(const TrainConfig& config, const MachineResources& machine, int ranks,
                  std::vector<std::string>& warnings) {
  const RankMemoryEstimate estimate = estimate_rank_memory(config);
  const int64_t needed = estimate.on_machine(ranks);
  const std::string fewer_ranks = ranks > 1 ? ", fewer ranks than " + ranks_flag(config, ranks) : "";
  if (!machine.available_memory_bytes) {
    warnings.push_back(fmt::format("memory: about {} needed; the available memory is {}, so this is not checked",
                                   bytes_text(needed), machine.memory_source));
  } else {
    const int64_t available = *machine.available_memory_bytes;
    TESSERA_CHECK(needed <= available,
                  "memory: {} x {} per rank (--batch {}, --seq-len {}, the model) + {} = about {}, but this machine "
                  "has {} available ({}); lower --batch or --seq-len{}, or use a smaller model",
                  plural(ranks, "rank"), bytes_text(estimate.per_rank()), config.batch, config.seq_len,
                  data_text(estimate, ranks), bytes_text(needed), bytes_text(available), machine.memory_source,
                  fewer_ranks);
    if (static_cast<double>(needed) > kMemoryWarningFraction * static_cast<double>(available)) {
      warnings.push_back(fmt::format("memory: about {} of the {} available ({:.0f}%): anything else that grows on "
                                     "this machine may push the run into swap; lower --batch or --seq-len{} for "
                                     "headroom",
                                     bytes_text(needed), bytes_text(available),
                                     100.0 * static_cast<double>(needed) / static_cast<double>(available),
                                     fewer_ranks));
    }
  }
}

}  // namespace

std::vector<std::string> check_train_resources(const TrainConfig& config, const MachineResources& machine,
                                                const tessera::dist::LaunchInfo& launch) {
  config.validate();
  const int cores = std::max(1, machine.cores);
  const int ranks = ranks_on_machine(config, launch);
  std::vector<std::string> warnings;

  TESSERA_CHECK(config.backend != "local" || config.nproc <= kMaxLocalRanks,
                "--nproc {}: more than {} local ranks (threads of one process, each with its own shards, "
                "activations and collectives, on {}); run that many ranks as processes: mpirun -np {} train "
                "--backend mpi",
                config.nproc, kMaxLocalRanks, plural(cores, "core"), config.nproc);

  // The threads that keep every core busy, and every rank: one a rank at the
  // least, so ranks beyond the cores are the ranks' warning, not this one.
  const int64_t runnable = std::max(cores, ranks);
  if (config.threads > 0) {
    const int64_t threads = static_cast<int64_t>(config.threads) * ranks;
    const int64_t fair_share = std::max(1, cores / ranks);
    TESSERA_CHECK(threads <= kMaxThreadOversubscription * runnable,
                  "--threads {}: {} x {} = {} threads on {}, more than {}x the {} that keep every {} busy: every "
                  "step would be many times slower; pass --threads 0 (the cores shared out among the ranks) or at "
                  "most {}",
                  config.threads, plural(ranks, "rank"), config.threads, threads, plural(cores, "core"),
                  kMaxThreadOversubscription, runnable, ranks > cores ? "rank" : "core", fair_share);
    if (threads > runnable) {
      warnings.push_back(fmt::format("--threads {}: {} x {} = {} threads on {}: oversubscribed, each step will be "
                                     "slower; --threads 0 or at most {} uses the cores without oversubscribing",
                                     config.threads, plural(ranks, "rank"), config.threads, threads,
                                     plural(cores, "core"), fair_share));
    }
  }

  check_memory(config, machine, ranks, warnings);

  if (ranks > cores) {
    warnings.push_back(fmt::format("{}: {} share {}: they take turns, so a step takes about {}x as long as with a "
                                   "core each (fine for tests and teaching)",
                                   ranks_flag(config, ranks), plural(ranks, "rank"), plural(cores, "core"),
                                   (ranks + cores - 1) / cores));
  }
  return warnings;
}

std::string describe_memory(const RankMemoryEstimate& estimate, int ranks_on_machine,
                            const MachineResources& machine) {
  const std::string available =
      machine.available_memory_bytes
          ? fmt::format("{} available ({})", bytes_text(*machine.available_memory_bytes), machine.memory_source)
          : fmt::format("available memory {}", machine.memory_source);
  return fmt::format(
      "about {} per rank (shards {}, {}gathered parameters {}, gradients in flight {}, activations {}) x {} + {} = "
      "{} of {}",
      bytes_text(estimate.per_rank()), bytes_text(estimate.sharded_state),
      estimate.buffers > 0 ? fmt::format("buffers {}, ", bytes_text(estimate.buffers)) : std::string(),
      bytes_text(estimate.gathered_parameters), bytes_text(estimate.gathered_gradients),
      bytes_text(estimate.activations), plural(ranks_on_machine, "rank"),
      data_text(estimate, ranks_on_machine), bytes_text(estimate.on_machine(ranks_on_machine)), available);
}

// ---- generation ------------------------------------------------------------------------------------------

int64_t max_new_tokens_allowed(int64_t prompt_tokens, const MachineResources& machine, int64_t sequences) {
  const double budget = machine.available_memory_bytes
                            ? kGenerateMemoryFraction * static_cast<double>(*machine.available_memory_bytes)
                            : static_cast<double>(std::numeric_limits<int64_t>::max());
  const double tokens = std::floor(
      (std::floor(budget / kGenerateBytesPerToken) - static_cast<double>(prompt_tokens)) /
      static_cast<double>(std::max<int64_t>(sequences, 1)));
  return tokens <= 0.0 ? 0 : static_cast<int64_t>(std::min(tokens, 9.2e18));
}

void check_generation_length(int64_t prompt_tokens, int64_t max_new_tokens, const MachineResources& machine,
                             int64_t sequences) {
  const int64_t allowed = max_new_tokens_allowed(prompt_tokens, machine, sequences);
  const double bytes = (static_cast<double>(max_new_tokens) * static_cast<double>(std::max<int64_t>(sequences, 1)) +
                        static_cast<double>(prompt_tokens)) *
                       kGenerateBytesPerToken;
  TESSERA_CHECK(max_new_tokens <= allowed,
                "--max-new-tokens {}: the tokens and their printed text need about {} ({} bytes a token{}), more than "
                "{:.0f}% of the {} this machine has available ({}); this machine allows at most --max-new-tokens {}",
                max_new_tokens, bytes_text(capped(bytes)), kGenerateBytesPerToken,
                sequences > 1 ? fmt::format(", {} sequences", sequences) : std::string(),
                100.0 * kGenerateMemoryFraction,
                machine.available_memory_bytes ? bytes_text(*machine.available_memory_bytes) : std::string("memory"),
                machine.memory_source, allowed);
}

}  // namespace tessera::train
