// The settings of a training run and the `train` command line that fills
// them: a model family and preset, explicit shape flags that override it, the
// optimisation, data and logging settings, and how FSDP shards the model over
// the ranks.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "fsdp/fully_shard.h"
#include "fsdp/plan.h"
#include "nn/activation_checkpoint.h"
#include "nn/models/gpt_config.h"
#include "nn/models/llama_config.h"
#include "tensor/device.h"
#include "tensor/dtype.h"
#include "train/model_family.h"

namespace tessera::train {

inline constexpr const char* kSyntheticData = "synthetic";

// Bounds of a run's sizes, held by the flags and by TrainConfig::validate:
// far beyond any real run, and finite, so that no step can be endless (a
// stop request is honoured between micro-batches) and no product overflows.
inline constexpr int64_t kMaxBatch = 1 << 20;
inline constexpr int64_t kMaxGradAccum = 1 << 16;
inline constexpr int64_t kMaxTokensPerStep = int64_t{1} << 40;
inline constexpr int64_t kMaxRanks = 1 << 20;

struct TrainConfig {
  std::string preset = "tiny";
  // The model: a GPT by default; setting `llama` makes the run a Llama's and
  // leaves `model` unused. Chosen over one variant field so that GPT runs
  // (and every test and benchmark that shapes one) keep writing
  // `config.model.n_layer = 4`; whatever depends on the family reads
  // model_config() and asks model_family.h, never `model` or `llama` directly.
  tessera::nn::GPTConfig model = tessera::nn::GPTConfig::preset("tiny");  // preset + explicit flags
  std::optional<tessera::nn::LlamaConfig> llama;                         // --model llama: its preset + flags
  int64_t seq_len = 64;     // tokens per sequence, <= the model's block_size
  int64_t batch = 32;       // sequences per micro-batch
  int64_t grad_accum = 1;   // micro-batches per optimizer step
  // When the micro-batches' gradients are reduce-scattered (fsdp/plan.h):
  // after the last (FSDP2's recipe: fewest collectives, but every group's
  // unsharded gradients kept in between: 15 GiB a rank at Llama 3 8B in
  // bf16), or after each (grad_accum times the reduce-scatters, none kept).
  tessera::fsdp::GradientSync grad_sync = tessera::fsdp::GradientSync::last_micro_batch;
  int64_t steps = 500;      // optimizer steps
  double lr = 3e-3;         // peak; cosine decay to lr * min_lr_ratio
  double min_lr_ratio = 0.1;
  // Linear warmup steps. 200, not 20, for the default job: the byte values
  // its corpus never holds (144 of 256) share one direction through the tied
  // head, along which AdamW pushes them down. Once they are down to ~10% of
  // the mass (after ~0.03 of summed lr), they take much of it back for one
  // step, the more so the larger the lr then: with warmup 20 that is step 23
  // or 24 at lr 3e-3 (loss 3.4 -> 7.8, grad norm 47 to 153); a 200-step ramp
  // passes that point at lr 1e-3, with no jump on any seed tried and final
  // losses as good.
  int64_t warmup = 200;
  double weight_decay = 0.1;  // on matmul and embedding weights only
  double clip = 1.0;        // max global grad norm; 0 = off
  uint64_t seed = 1337;     // model init and data order
  int threads = 0;          // per rank; 0 = the cores shared out among the ranks
  std::string data;         // "" = the default corpus, "synthetic", or a file
  // "" = byte-level tokens; else a BPE tokenizer (tokenizer.json, or GPT-2's
  // vocab.json + merges.txt: tokenizer/tokenizer.h) that tokenizes the text
  // and whose ids set the vocabulary (parse_command_line sets model's).
  std::string tokenizer;
  bool allow_data_change = false;  // --resume may continue on other data (recorded in the run's run.json)
  std::string log_json;     // "" = no JSON-lines log
  int64_t eval_every = 50;  // validation loss every N steps (and at the last); 0 = never
  int64_t eval_batches = 8;  // micro-batches per validation
  std::string loss_plot;    // "" = none; else the loss curve drawn as SVG at the end (loss_plot.h)

  // Where the model, activations, gradients and optimizer state live: cpu, or
  // cuda (the simulator or a GPU, whichever this build's runtime is). cuda
  // runs on one rank: collectives across ranks on cuda need the NCCL backend,
  // which tessera does not have yet.
  tessera::Device device = tessera::kCPU;

  // Parallelism: `train` always runs the FSDP2 recipe, one rank included.
  std::string backend = "local";  // "local": nproc ranks as threads; "mpi": the mpirun/srun world
  int nproc = 1;                  // ranks (with mpi: the launcher's world size)
  int hsdp = 1;                   // replicate degree R: a (R, nproc / R) mesh; 1 = a 1-D shard mesh
  // Tensor-parallel degree T: the mesh's innermost dim (contiguous ranks, one
  // NVLink island on GPUs), (shard, tp) or (replicate, shard, tp); the T ranks
  // of a tp group read one batch and hold one model between them (tp/plans.h).
  int tp = 1;
  // Async tensor parallelism (tp::PlanOptions::async_chunks): 0 moves the
  // activations whole; K >= 1 fuses the moves into the products in K batch
  // chunks that overlap the GEMMs.
  int async_tp = 0;
  // Activation checkpointing of the blocks (--ac off|full|every:K|selective): applied
  // after tensor parallelism and before FSDP, as torchtitan does. It changes
  // memory and time, never the numbers.
  tessera::nn::ActivationCheckpointPolicy ac;
  tessera::fsdp::ReshardAfterForward reshard_after_forward = true;  // for every block; the root keeps false
  tessera::DType param_dtype = tessera::DType::f32;                 // what forward computes on and all-gathers move
  std::optional<tessera::DType> reduce_dtype;                       // gradient reduce-scatter; unset: param_dtype
  bool deterministic = false;  // rank-order reductions (bitwise reproducible)
  bool cpu_offload = false;    // FSDP's CPUOffloadPolicy: shards, gradients, AdamW in pinned host memory (cuda)
  // --offload-step: under cpu_offload, AdamW's host step run whole before the
  // next forward (FSDP2's way), or overlapped with it group by group
  // (fsdp/offloaded_optimizer_step.h); the same bits either way. Whole is the
  // default: on an H100 with 16 host cores the overlap measured no faster on
  // GPT-2 124M (docs/fsdp_on_gpus.md, section 7).
  bool overlap_offloaded_step = false;
  std::string trace;           // "" = none; else a Chrome/Perfetto trace of every rank
  bool plan = false;           // print the sharding plan and exit (starts no rank: any --nproc, any model)
  bool sweep = false;          // with plan: also plan 1, 2, 4, ..., 1024 ranks, FSDP and HSDP (run_plan.h)
  std::string sweep_out;       // "" = none; else the sweep's figures as .json or .csv (by extension)
  std::string sweep_svg;       // "" = none; else the sweep's chart

  // Checkpoints (checkpoint/): DIR/step-NNNNNNNN, every rank writing its shards.
  std::string ckpt_dir;      // "" = none
  int64_t ckpt_every = 0;    // save every K steps (and at the last step); 0 = only at the last step
  int keep = 0;              // keep the newest K checkpoints; 0 = all
  bool resume = false;       // start from the latest checkpoint in ckpt_dir (fresh when there is none)
  bool async_ckpt = false;   // snapshot, then write in the background while training goes on
  std::string export_path;   // "" = none; else the trained model as one .safetensors file (or an hf directory)
  std::string export_format = "safetensors";  // or "hf": a Hugging Face model directory (huggingface/hf_checkpoint.h)
  // "" = none; else start from the weights of this .safetensors file, or of
  // this Hugging Face model directory (which then sets the model's shape).
  std::string init_from;
  // Fine-tuning (train/lora_fine_tuning.h): LoRA adapters of rank
  // lora_rank (0 = none) scaled by lora_alpha / rank on every attention and
  // MLP projection, every other parameter frozen; with nf4, the frozen
  // projections are stored and gathered in NF4 (QLoRA).
  // float8 training (torchao's tensorwise recipe, train/lora_fine_tuning.h's
  // neighbour): every block projection computes in float8 and FSDP gathers
  // its weight as float8 codes; the head and the embeddings stay as they are.
  bool float8 = false;
  int64_t lora_rank = 0;
  double lora_alpha = 0.0;  // 0: twice the rank (torchtune's recipes: rank 8, alpha 16)
  bool nf4 = false;
  // Replace output files an earlier launch left (a fresh run's log, the
  // trace, the export). Without it such a file is refused before step 1.
  bool overwrite = false;

  double lora_scale_alpha() const { return lora_alpha > 0.0 ? lora_alpha : 2.0 * static_cast<double>(lora_rank); }
  ModelConfig model_config() const { return llama ? ModelConfig(*llama) : ModelConfig(model); }
  ModelFamily family() const { return llama ? ModelFamily::llama : ModelFamily::gpt; }
  // Every rank's micro-batches: the global batch of one optimizer step.
  int64_t tokens_per_step() const { return batch * seq_len * grad_accum * data_ranks(); }
  // The ranks that read their own batches: every tp group reads one.
  int64_t data_ranks() const { return nproc / tp; }
  // FSDP's shard group: the data ranks less the HSDP replicas.
  int64_t shard_ranks() const { return nproc / (hsdp * tp); }
  // Throws tessera::Error naming the first bad setting (non-finite numbers included).
  void validate() const;
};

// Parses train's command line into `config`. Returns nullopt when training
// should go on; otherwise the process's exit code, with the message (help, or
// the error naming the bad flag) already written to `out` / `err`.
std::optional<int> parse_command_line(int argc, const char* const* argv, TrainConfig& config, std::ostream& out,
                                      std::ostream& err);

// One line per setting group, for the top of the log.
std::string describe(const TrainConfig& config);

// --grad-sync's word for `sync`: "last" or "every".
const char* grad_sync_name(tessera::fsdp::GradientSync sync);

// fully_shard's options for the model's blocks, or (root) for the model:
// the run's dtypes, reshard_after_forward (the root keeps FSDP's default for
// roots: not resharded after forward, as backward needs it first) and CPU
// offload, on `mesh` (unset: for a plan, whose mesh is its sizes).
tessera::fsdp::FullyShardOptions fully_shard_options(const TrainConfig& config, bool root,
                                                     std::optional<tessera::dist::DeviceMesh> mesh);

}  // namespace tessera::train
