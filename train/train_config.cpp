// train's flags (CLI11): --model picks the family, its preset fills the model
// shape first, then every shape flag given explicitly overrides its field;
// the FSDP flags are checked against the world size (--nproc, or the
// launcher's under --backend mpi).
#include "train/train_config.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "dist/backends/nccl_backend.h"
#include "dist/launch/launch_environment.h"
#include "tensor/error.h"
#include "train/flag_checks.h"
#include "train/huggingface/hf_checkpoint.h"
#include "train/token_cache.h"

namespace tessera::train {

namespace {

// The ranges of the numeric flags: wide enough for any real run, finite so
// that no value can make a loop endless or a product overflow.
constexpr int64_t kMaxModelDim = kMaxModelWidth;  // --n-embd, --ffn-hidden, --seq-len, --vocab (model_family.h)
constexpr int64_t kMaxCount = 1'000'000'000;  // --steps, --warmup, --eval-every, --ckpt-every
constexpr int64_t kMaxThreads = 4096;
constexpr int64_t kMaxEvalBatches = 1 << 16;
constexpr int64_t kMaxKeep = 1'000'000;
constexpr double kMaxLr = 100.0;
constexpr double kMaxWeightDecay = 100.0;
constexpr double kMaxClip = 1e9;

// The dtypes FSDP's mixed precision takes on the command line.
tessera::DType parse_dtype(const std::string& name) {
  if (name == "f32") return tessera::DType::f32;
  if (name == "bf16") return tessera::DType::bf16;
  tessera::fail("unknown dtype '{}' (f32 or bf16)", name);
}
const std::vector<std::string> kDtypeNames = {"f32", "bf16"};

// "true", "false" or a positive rank count.
std::optional<tessera::fsdp::ReshardAfterForward> parse_reshard(const std::string& text) {
  using tessera::fsdp::ReshardAfterForward;
  if (text == "true") return ReshardAfterForward::always();
  if (text == "false") return ReshardAfterForward::never();
  int64_t count = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), count);
  if (error != std::errc() || end != text.data() + text.size() || count < 1) return std::nullopt;
  return ReshardAfterForward::to_group_of(count);
}

constexpr std::string_view kNoNcclBuilt =
    "--backend nccl: this build has no NCCL backend (build the nvidia runtime, -Dgpu_runtime=nvidia, where NCCL is "
    "found)";

// --backend mpi takes its world from the launcher; --backend local must not
// run under one (every process would train alone on its own threads).
void read_world_size(TrainConfig& config, bool nproc_given) {
  const tessera::dist::LaunchInfo launch = tessera::dist::detect_launch();
  const bool launched = launch.launcher == tessera::dist::Launcher::mpirun ||
                        launch.launcher == tessera::dist::Launcher::slurm;
  if (config.backend == "local") {
    TESSERA_CHECK(!launched || launch.world_size == 1,
                  "--backend local, but {} started this process as rank {} of {}; pass --backend mpi",
                  tessera::dist::launcher_name(launch.launcher), launch.rank, launch.world_size);
    return;
  }
  if (config.backend == "nccl") {
    TESSERA_CHECK(tessera::dist::nccl_backend_built(), "{}", kNoNcclBuilt);
    const bool any_launcher = launch.launcher != tessera::dist::Launcher::local;
    TESSERA_CHECK(any_launcher || !nproc_given || config.nproc == 1,
                  "--backend nccl --nproc {}: NCCL takes one process per GPU; start {} processes with mpirun, srun or "
                  "torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)",
                  config.nproc, config.nproc);
    TESSERA_CHECK(!any_launcher || !nproc_given || config.nproc == launch.world_size,
                  "--nproc {} differs from the {} ranks {} started; leave --nproc out under --backend nccl",
                  config.nproc, launch.world_size, tessera::dist::launcher_name(launch.launcher));
    config.nproc = launch.world_size;
    return;
  }
  TESSERA_CHECK(launched, "--backend mpi needs a launcher: start it as `mpirun -np N train --backend mpi ...` (or "
                "srun); without one, use --backend local --nproc N");
  TESSERA_CHECK(!nproc_given || config.nproc == launch.world_size,
                "--nproc {} differs from the {} ranks {} started; leave --nproc out under --backend mpi", config.nproc,
                launch.world_size, tessera::dist::launcher_name(launch.launcher));
  config.nproc = launch.world_size;
}

// The shape flags given explicitly, applied over the preset.
struct ShapeFlags {
  std::optional<int64_t> n_layer, n_head, n_embd, vocab, seq_len, n_kv_head, ffn_hidden, vocab_padding;
};

// The preset of `family` with the shape flags over it; the context grows to
// fit --seq-len.
ModelConfig model_from_flags(ModelFamily family, const std::string& preset, const ShapeFlags& flags) {
  ModelConfig config = preset_config(family, preset);
  std::visit(
      [&](auto& model) {
        if (flags.n_layer) model.n_layer = *flags.n_layer;
        if (flags.n_head) model.n_head = *flags.n_head;
        if (flags.n_embd) model.n_embd = *flags.n_embd;
        if (flags.vocab) model.vocab_size = *flags.vocab;
        if (flags.seq_len) model.block_size = std::max(model.block_size, *flags.seq_len);
      },
      config);
  if (auto* llama = std::get_if<tessera::nn::LlamaConfig>(&config)) {
    if (flags.n_kv_head) llama->n_kv_head = *flags.n_kv_head;
    if (flags.ffn_hidden) llama->ffn_hidden = *flags.ffn_hidden;
    TESSERA_CHECK(!flags.vocab_padding, "--vocab-padding pads a GPT's tied head; a Llama's vocabulary is not padded");
  } else {
    TESSERA_CHECK(!flags.n_kv_head && !flags.ffn_hidden,
                  "--n-kv-head and --ffn-hidden shape a Llama (grouped-query attention, SwiGLU), not a GPT: pass "
                  "--model llama, or leave them out");
    auto& gpt = std::get<tessera::nn::GPTConfig>(config);
    if (flags.vocab_padding) gpt.vocab_padding_multiple = *flags.vocab_padding;
  }
  return config;
}

// The model of --init-from DIR, a Hugging Face directory: its config.json
// sets the family and shape, so the flags that would set them are refused
// (--vocab-padding, a tessera choice, stays). --seq-len stays within the
// checkpoint's context.
ModelConfig model_from_hf_dir(const std::string& dir, const std::optional<ModelFamily>& family_flag,
                              bool preset_given, const ShapeFlags& flags) {
  ModelConfig config = read_hf_model_info(dir).config;
  TESSERA_CHECK(!family_flag || *family_flag == family_of(config),
                "--model {}, but --init-from {} holds a {} model; leave --model out", family_name(*family_flag), dir,
                family_name(family_of(config)));
  const bool shape_given = preset_given || flags.n_layer || flags.n_head || flags.n_embd || flags.vocab ||
                           flags.n_kv_head || flags.ffn_hidden;
  TESSERA_CHECK(!shape_given,
                "--init-from {} is a Hugging Face model whose shape its config.json sets; leave out --preset, "
                "--n-layer, --n-head, --n-embd, --vocab, --n-kv-head and --ffn-hidden",
                dir);
  TESSERA_CHECK(!flags.seq_len || *flags.seq_len <= block_size(config),
                "--seq-len {} exceeds the context of --init-from {} ({} positions)", flags.seq_len.value_or(0), dir,
                block_size(config));
  if (flags.vocab_padding) {
    auto* gpt = std::get_if<tessera::nn::GPTConfig>(&config);
    TESSERA_CHECK(gpt != nullptr, "--vocab-padding pads a GPT's tied head; a Llama's vocabulary is not padded");
    gpt->vocab_padding_multiple = *flags.vocab_padding;
  }
  return config;
}

// The vocabulary of --tokenizer: its ids.
int64_t tokenizer_vocab(const std::string& path, bool vocab_given) {
  TESSERA_CHECK(!vocab_given, "--vocab and --tokenizer both set the vocabulary; leave --vocab out");
  return Tokenizer::load(path).vocab_size();
}

}  // namespace

void TrainConfig::validate() const {
  const ModelConfig shape = model_config();
  train::validate(shape);
  for (const auto& [flag, value] : {std::pair{"--lr", lr}, std::pair{"min_lr_ratio", min_lr_ratio},
                                    std::pair{"--weight-decay", weight_decay}, std::pair{"--clip", clip}}) {
    TESSERA_CHECK(std::isfinite(value), "{} must be a finite number, got {}", flag, value);
  }
  TESSERA_CHECK(seq_len >= 1 && seq_len <= block_size(shape), "--seq-len must be in [1, block_size = {}], got {}",
                block_size(shape), seq_len);
  TESSERA_CHECK(batch >= 1 && batch <= kMaxBatch, "--batch must be in [1, {}], got {}", kMaxBatch, batch);
  TESSERA_CHECK(grad_accum >= 1 && grad_accum <= kMaxGradAccum, "--grad-accum must be in [1, {}], got {}",
                kMaxGradAccum, grad_accum);
  TESSERA_CHECK(nproc >= 1 && nproc <= kMaxRanks, "--nproc must be in [1, {}], got {}", kMaxRanks, nproc);
  // In floating point: the product of four bounded ints may overflow int64.
  const double tokens = static_cast<double>(batch) * static_cast<double>(seq_len) * static_cast<double>(grad_accum) *
                        static_cast<double>(nproc);
  TESSERA_CHECK(tokens <= static_cast<double>(kMaxTokensPerStep),
                "a step of {:.0f} tokens (--batch {} x --seq-len {} x --grad-accum {} x {} ranks) is more than {}; "
                "lower --grad-accum or --batch",
                tokens, batch, seq_len, grad_accum, nproc, kMaxTokensPerStep);
  TESSERA_CHECK(steps >= 1, "--steps must be >= 1, got {}", steps);
  TESSERA_CHECK(lr > 0.0, "--lr must be > 0, got {}", lr);
  TESSERA_CHECK(min_lr_ratio >= 0.0 && min_lr_ratio <= 1.0, "min_lr_ratio must be in [0, 1], got {}", min_lr_ratio);
  TESSERA_CHECK(warmup >= 0 && warmup <= steps, "--warmup must be in [0, --steps = {}], got {}", steps, warmup);
  TESSERA_CHECK(weight_decay >= 0.0, "--weight-decay must be >= 0, got {}", weight_decay);
  TESSERA_CHECK(clip >= 0.0, "--clip must be >= 0 (0 = off), got {}", clip);
  TESSERA_CHECK(threads >= 0, "--threads must be >= 0 (0 = all cores), got {}", threads);
  TESSERA_CHECK(eval_every >= 0, "--eval-every must be >= 0 (0 = never), got {}", eval_every);
  TESSERA_CHECK(eval_batches >= 1, "--eval-batches must be >= 1, got {}", eval_batches);
  TESSERA_CHECK(!plan || loss_plot.empty(), "--loss-plot draws a training run's loss; --plan trains nothing");
  TESSERA_CHECK(backend == "local" || backend == "mpi" || backend == "nccl",
                "--backend must be local, mpi or nccl, got '{}'", backend);
  TESSERA_CHECK(device.is_cpu() || device.is_cuda(), "--device must be cpu or cuda, got {}", device.str());
  TESSERA_CHECK(backend != "nccl" || device.is_cuda(), "--backend nccl moves GPU memory: it needs --device cuda");
  TESSERA_CHECK(backend != "nccl" || tessera::dist::nccl_backend_built(), "{}", kNoNcclBuilt);
  // Ranks on cuda need device collectives: NCCL's, or the local backend's
  // on the simulator (each rank its own simulated GPU).
  TESSERA_CHECK(device.is_cpu() || nproc == 1 || backend == "nccl" || (TESSERA_HAVE_CUDA_SIM && backend == "local"),
                "--device cuda with --nproc {} needs collectives between GPUs: --backend nccl (one process per GPU), "
                "or ranks as threads on the simulator (--backend local, in a simulator build)",
                nproc);
  TESSERA_CHECK(!cpu_offload || device.is_cuda(), "--cpu-offload keeps the shards in host memory while a GPU "
                "computes: it needs --device cuda (on the cpu they are in host memory already)");
  TESSERA_CHECK(!overlap_offloaded_step || cpu_offload,
                "--offload-step overlapped chooses how --cpu-offload's host optimizer step runs; without "
                "--cpu-offload the optimizer steps where the shards are");
  TESSERA_CHECK(hsdp >= 1 && nproc % hsdp == 0,
                "--hsdp {} must divide the {} ranks (--nproc): the mesh is hsdp x nproc / hsdp (replicate x shard)",
                hsdp, nproc);
  TESSERA_CHECK(tp >= 1 && nproc % (static_cast<int64_t>(hsdp) * tp) == 0,
                "--tp {} with --hsdp {} must divide the {} ranks (--nproc): the mesh is hsdp x shard x tp", tp, hsdp,
                nproc);
  TESSERA_CHECK(async_tp == 0 || tp > 1, "--async-tp {} overlaps tensor parallelism's collectives: pass --tp too",
                async_tp);
  if (tp > 1) {
    TESSERA_CHECK(seq_len % tp == 0,
                  "--seq-len {} does not divide by --tp {}: sequence parallelism splits every sequence evenly", seq_len,
                  tp);
  }
  if (const std::optional<int64_t> count = reshard_after_forward.group_size()) {
    TESSERA_CHECK(tp == 1, "--reshard-after-forward {}: a group size is refused with --tp (true or false)", *count);
    TESSERA_CHECK(shard_ranks() % *count == 0,
                  "--reshard-after-forward {} must divide the shard group size {} (--nproc {} / --hsdp {}); 1 is "
                  "false, {} is true",
                  *count, shard_ranks(), nproc, hsdp, shard_ranks());
  }
  TESSERA_CHECK(tessera::is_floating(param_dtype), "--param-dtype must be floating, got {}",
                tessera::dtype_name(param_dtype));
  TESSERA_CHECK(!reduce_dtype || tessera::is_floating(*reduce_dtype), "--reduce-dtype must be floating, got {}",
                tessera::dtype_name(*reduce_dtype));
  TESSERA_CHECK(ckpt_every >= 0, "--ckpt-every must be >= 0, got {}", ckpt_every);
  TESSERA_CHECK(keep >= 0, "--keep must be >= 0 (0 keeps all), got {}", keep);
  const bool checkpoints_asked = ckpt_every > 0 || keep > 0 || resume || async_ckpt;
  TESSERA_CHECK(!checkpoints_asked || !ckpt_dir.empty(),
                "--ckpt-every, --keep, --resume and --async-ckpt need --ckpt-dir DIR");
  TESSERA_CHECK(!allow_data_change || resume, "--allow-data-change is for --resume (a fresh run takes any --data)");
  TESSERA_CHECK(tokenizer.empty() || data != kSyntheticData,
                "--tokenizer tokenizes the text of --data; --data synthetic has none");
  TESSERA_CHECK(!sweep || plan, "--sweep is part of the plan: pass --plan --sweep");
  TESSERA_CHECK(sweep || (sweep_out.empty() && sweep_svg.empty()),
                "--sweep-out and --sweep-svg write the sweep: pass --plan --sweep");
  TESSERA_CHECK(sweep_out.empty() || sweep_out.ends_with(".json") || sweep_out.ends_with(".csv"),
                "--sweep-out {}: its extension picks the format, .json or .csv", sweep_out);
  TESSERA_CHECK(lora_alpha == 0.0 || lora_rank > 0, "--lora-alpha scales LoRA's adapters: pass --lora R");
  TESSERA_CHECK(!nf4 || lora_rank > 0, "--nf4 freezes the projections in 4 bits; the adapters of --lora R are what "
                "trains: pass --lora R");
  TESSERA_CHECK(!nf4 || !init_from.empty() || plan, "--nf4 quantises pretrained weights: pass --init-from");
  TESSERA_CHECK(lora_rank == 0 || tp == 1, "--lora with --tp {}: LoRA adapters under tensor parallelism are not "
                "supported; drop --tp", tp);
  TESSERA_CHECK(!float8 || !nf4, "--float8 trains weights in 8 bits; --nf4 freezes them in 4: pick one");
  TESSERA_CHECK(!float8 || tp == 1, "--float8 with --tp {}: each rank's piece of an activation would take its own "
                "amax, not the whole tensor's; float8 under tensor parallelism is not supported yet: drop --tp", tp);
  TESSERA_CHECK(!float8 || !overlap_offloaded_step, "--float8 with --offload-step overlapped: the weights change "
                "during the forward their float8 scales are taken for; use --offload-step whole");
  TESSERA_CHECK(export_format == "safetensors" || export_format == "hf",
                "--format must be safetensors or hf, got '{}'", export_format);
  TESSERA_CHECK(export_format == "safetensors" || !export_path.empty(), "--format {} is the format of --export DIR: "
                "pass --export too", export_format);
}

namespace {

// A shape flag's value, and whether it was given (only given ones override the preset).
struct ShapeOverride {
  int64_t value = 0;
  CLI::Option* option = nullptr;
  std::optional<int64_t> given() const { return option->count() > 0 ? std::optional(value) : std::nullopt; }
};

// What the flags set beyond plain TrainConfig fields: read once the command
// line is parsed, since a flag may decide how another one counts.
struct ModelFlags {
  std::string family = "gpt";
  CLI::Option* family_option = nullptr;
  CLI::Option* preset_option = nullptr;
  ShapeOverride n_layer, n_head, n_embd, vocab, seq_len, n_kv_head, ffn_hidden, vocab_padding;
};
struct OptimizationFlags {
  std::string grad_sync;
  CLI::Option* warmup_option = nullptr;
};
struct ParallelismFlags {
  std::string device = "cpu";
  CLI::Option* nproc_option = nullptr;
  std::string reshard = "true";
  std::string param_dtype = "f32", reduce_dtype;
  std::string offload_step;
};
struct CommandLineFlags {
  ModelFlags model;
  OptimizationFlags optimization;
  ParallelismFlags parallelism;
  CLI::Option* tokenizer_option = nullptr;
};

// --model, --preset and the shape overrides.
void add_model_flags(CLI::App& app, TrainConfig& config, ModelFlags& flags) {
  flags.family_option =
      app.add_option("--model", flags.family, "Model family: gpt (GPT-2: LayerNorm, GELU MLP, tied head) or llama "
                     "(RMSNorm, rotary grouped-query attention, SwiGLU)")
          ->check(CLI::IsMember(family_names()));
  flags.preset_option = app.add_option("--preset", config.preset, "Model shape preset of the --model family")
                            ->default_str(fmt::format("{} (gpt), {} (llama)", default_preset(ModelFamily::gpt),
                                                      default_preset(ModelFamily::llama)));
  auto shape = [&](const char* name, ShapeOverride& flag, const std::string& help, int64_t max) {
    flag.option = app.add_option(name, flag.value, help)->check(integer_in(1, max))->default_str("preset");
  };
  shape("--n-layer", flags.n_layer, "Transformer blocks", kMaxLayersOrHeads);
  shape("--n-head", flags.n_head, "Attention heads", kMaxLayersOrHeads);
  shape("--n-embd", flags.n_embd, "Embedding width (a multiple of --n-head)", kMaxModelDim);
  shape("--vocab", flags.vocab, "Vocabulary size (>= the data's largest token + 1)", kMaxModelDim);
  shape("--vocab-padding", flags.vocab_padding,
        "Pad wte and the tied head to a multiple of this many rows, for aligned GEMMs; the padding is outside the "
        "softmax (gpt; gpt2 presets: 128, llm.c's 50304; 1 = none)",
        1024);
  shape("--seq-len", flags.seq_len, "Tokens per sequence (default: the preset's context; the context grows to fit)",
        kMaxModelDim);
  shape("--n-kv-head", flags.n_kv_head, "Key/value heads, dividing --n-head (llama: grouped-query attention)",
        kMaxLayersOrHeads);
  shape("--ffn-hidden", flags.ffn_hidden, "SwiGLU hidden width F (llama)", kMaxModelDim);
}

// The batch geometry, the optimizer and its schedule, the seed and threads.
void add_optimization_flags(CLI::App& app, TrainConfig& config, OptimizationFlags& flags) {
  app.add_option("--batch", config.batch, "Sequences per micro-batch")->check(integer_in(1, kMaxBatch));
  app.add_option("--grad-accum", config.grad_accum, "Micro-batches per optimizer step")
      ->check(integer_in(1, kMaxGradAccum));
  flags.grad_sync = grad_sync_name(config.grad_sync);
  app.add_option("--grad-sync", flags.grad_sync,
                 "When --grad-accum's micro-batches reduce-scatter their gradients: last (one reduce-scatter a step; "
                 "every group's unsharded gradients kept between micro-batches) or every (one a micro-batch; none "
                 "kept)")
      ->check(CLI::IsMember({"last", "every"}))
      ->capture_default_str();
  app.add_option("--steps", config.steps, "Optimizer steps")->check(integer_in(1, kMaxCount));
  app.add_option("--lr", config.lr, "Peak learning rate (cosine decay to lr/10)")->check(number_in(0.0, kMaxLr, true));
  flags.warmup_option = app.add_option("--warmup", config.warmup, "Linear warmup steps (at most --steps)")
                            ->check(integer_in(0, kMaxCount));
  app.add_option("--weight-decay", config.weight_decay, "AdamW weight decay on matmul and embedding weights")
      ->check(number_in(0.0, kMaxWeightDecay));
  app.add_option("--clip", config.clip, "Max global gradient norm (0 = off)")->check(number_in(0.0, kMaxClip));
  app.add_option("--seed", config.seed, "Seed of model init and data order")->check(any_uint64());
  app.add_option("--threads", config.threads, "CPU threads per rank (0 = the cores shared out among the ranks)")
      ->check(integer_in(0, kMaxThreads));
}

// The text and its tokenizer; returns --tokenizer's option.
CLI::Option* add_data_flags(CLI::App& app, TrainConfig& config) {
  app.add_option("--data", config.data, "Token file (text, or llm.c .bin), or 'synthetic'")
      ->check(non_empty_path())
      ->default_str("the Debian corpus");
  CLI::Option* tokenizer =
      app.add_option("--tokenizer", config.tokenizer,
                     "BPE tokenizer for the --data text: a tokenizer.json (Hugging Face), GPT-2's vocab.json or "
                     "encoder.json with merges.txt beside it, or a directory holding them; its ids set --vocab. The "
                     "tokens are cached in --ckpt-dir")
          ->check(non_empty_path())
          ->default_str("bytes (vocab 256)");
  app.add_flag("--allow-data-change", config.allow_data_change,
               "Let --resume continue on other data than the run's (recorded in the checkpoint root's run.json)");
  return tokenizer;
}

// What a run reports besides its banner and step lines: JSON lines, validation, the loss plot, the trace.
void add_report_flags(CLI::App& app, TrainConfig& config) {
  app.add_option("--log-json", config.log_json,
                 "Write one JSON object per step to this file (a --resume continues it from its checkpoint's step)")
      ->check(non_empty_path());
  app.add_option("--eval-every", config.eval_every, "Validation loss every N steps (0 = never)")
      ->check(integer_in(0, kMaxCount));
  app.add_option("--eval-batches", config.eval_batches, "Micro-batches per validation")
      ->check(integer_in(1, kMaxEvalBatches));
  app.add_option("--loss-plot", config.loss_plot,
                 "Draw the loss curve (train loss per step, validation loss at each evaluation) to this SVG file at "
                 "the end of the run")
      ->check(non_empty_path());
  app.add_option("--trace", config.trace,
                 "Write a Chrome/Perfetto trace of every rank to this file (a --resume whose file exists writes a "
                 "new one, named in the banner)")
      ->check(non_empty_path());
}

// The device, and FSDP over --nproc ranks: backend, resharding, mixed precision, HSDP, offload.
void add_parallelism_flags(CLI::App& app, TrainConfig& config, ParallelismFlags& flags) {
  app.add_option("--device", flags.device,
                 "Where the model trains: cpu, or cuda (a device a rank; the SIMT simulator or GPUs, as built)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  flags.nproc_option = app.add_option("--nproc", config.nproc,
                                      "Ranks, each with its own micro-batches (threads, or the launcher's processes)")
                           ->check(integer_in(1, kMaxRanks));
  app.add_option("--backend", config.backend,
                 "local (threads in this process), mpi (under mpirun/srun) or nccl (--device cuda, one process per "
                 "GPU under mpirun, srun or torchrun-style variables; alone, one rank)")
      ->check(CLI::IsMember({"local", "mpi", "nccl"}));
  app.add_option("--reshard-after-forward", flags.reshard,
                 "Blocks free their gathered parameters after forward: true, false, or N (keep an N-rank sharding "
                 "for backward)")
      ->check(CLI::Validator(
          [](std::string& input) -> std::string {
            if (parse_reshard(input)) return {};
            return fmt::format("expected true, false or a positive rank count, got '{}'", input);
          },
          "true|false|N"));
  app.add_option("--param-dtype", flags.param_dtype, "Dtype of the gathered parameters (forward, backward, all-gather)")
      ->check(CLI::IsMember(kDtypeNames));
  app.add_option("--reduce-dtype", flags.reduce_dtype, "Dtype of the gradient reduce-scatter")
      ->check(CLI::IsMember(kDtypeNames))
      ->default_str("--param-dtype");
  app.add_option("--hsdp", config.hsdp, "HSDP replicate degree R: a R x (nproc / R) (replicate, shard) mesh")
      ->check(integer_in(1, kMaxRanks));
  app.add_option("--tp", config.tp,
                 "Tensor-parallel degree T, the innermost mesh dim: each T contiguous ranks split every layer and read "
                 "one batch; FSDP shards over the rest (docs/tensor_parallel.md)")
      ->check(integer_in(1, kMaxRanks));
  app.add_option("--async-tp", config.async_tp,
                 "With --tp: fuse each sequence all-gather and reduce-scatter into the product beside it, in K batch "
                 "chunks whose collectives overlap the GEMMs (0: whole moves; the same bits either way)")
      ->check(integer_in(0, kMaxBatch));
  using tessera::nn::ActivationCheckpointPolicy;
  app.add_option_function<std::string>(
         "--ac", [&config](const std::string& text) { config.ac = ActivationCheckpointPolicy::parse(text); },
         "Activation checkpointing of the blocks: off, full, every:K (every K-th block) or selective; a checkpointed "
         "block keeps only its input (selective: and its GEMMs' and attention's outputs) and recomputes the rest in "
         "backward, the same bits (docs/training.md)")
      ->check(CLI::Validator(
          [](std::string& input) -> std::string {
            try {
              ActivationCheckpointPolicy::parse(input);
              return {};
            } catch (const tessera::Error& error) {
              return error.what();
            }
          },
          "off|full|every:K|selective"))
      ->default_str("off");
  app.add_flag("--deterministic", config.deterministic, "Rank-order reductions: bitwise reproducible runs");
  app.add_flag("--cpu-offload", config.cpu_offload,
               "With --device cuda: parameter shards, gradients and AdamW's state in pinned host memory (FSDP's "
               "CPUOffloadPolicy); the GPU holds the gathered blocks, activations and workspace");
  flags.offload_step = config.overlap_offloaded_step ? "overlapped" : "whole";
  app.add_option("--offload-step", flags.offload_step,
                 "With --cpu-offload: AdamW's host step whole before the next forward starts (whole, as FSDP2), or "
                 "overlapped with it one FSDP group at a time (overlapped); the same weights")
      ->check(CLI::IsMember({"overlapped", "whole"}))
      ->capture_default_str();
}

// --plan and its sweep over world sizes.
void add_plan_flags(CLI::App& app, TrainConfig& config) {
  app.add_flag("--plan", config.plan,
               "Print the sharding plan (shards, memory, bytes per step) and exit; starts no rank, so any --nproc "
               "and --hsdp plan in a moment");
  app.add_flag("--sweep", config.sweep,
               "With --plan: also plan 1, 2, 4, ..., 1024 ranks (FSDP, and HSDP with 2 and 8 replicas) and print "
               "per-rank memory and bytes per step");
  app.add_option("--sweep-out", config.sweep_out, "Write the sweep's figures to this file, as .json or .csv (by its "
                 "extension)")
      ->check(non_empty_path());
  app.add_option("--sweep-svg", config.sweep_svg,
                 "Draw the sweep to this SVG file: per-rank memory and bytes sent per step against ranks, log axes")
      ->check(non_empty_path());
}

// Checkpoints, resume, export and the weights a run starts from.
void add_checkpoint_flags(CLI::App& app, TrainConfig& config) {
  app.add_option("--ckpt-dir", config.ckpt_dir, "Save sharded checkpoints to DIR/step-N (at the last step too)")
      ->check(non_empty_path());
  app.add_option("--ckpt-every", config.ckpt_every, "Save every K steps (0 = only at the last)")
      ->check(integer_in(0, kMaxCount));
  app.add_option("--keep", config.keep, "Keep the newest K checkpoints (0 = all)")->check(integer_in(0, kMaxKeep));
  app.add_flag("--resume", config.resume, "Resume from the latest checkpoint in --ckpt-dir (any world size)");
  app.add_flag("--async-ckpt", config.async_ckpt, "Write checkpoints in the background while training goes on");
  app.add_option("--export", config.export_path,
                 "Write the trained model to this .safetensors file, or with --format hf to this directory")
      ->check(non_empty_path());
  app.add_option("--format,--export-format", config.export_format,
                 "What --export writes: safetensors (one file, tessera's names and config) or hf (a Hugging Face "
                 "model directory: config.json and model.safetensors, or shards of at most 5 GiB with their index, "
                 "that transformers' from_pretrained loads)")
      ->check(CLI::IsMember({"safetensors", "hf"}));
  app.add_option("--init-from", config.init_from,
                 "Start from these weights: a .safetensors file `train --export` wrote, or a Hugging Face model "
                 "directory (GPT-2 or Llama: config.json and model.safetensors or its shards), whose config sets the "
                 "model and whose tokenizer, when it has one, becomes --tokenizer")
      ->check(non_empty_path());
  app.add_flag("--float8", config.float8,
               "Train every block projection in float8 (e4m3 forward, e5m2 gradients, tensorwise scales), its weight "
               "gathered by FSDP as float8 codes (half of bf16's bytes); the head and embeddings are skipped "
               "(docs/float8.md)");
  app.add_option("--lora", config.lora_rank,
                 "Fine-tune with LoRA adapters of rank R on every attention and MLP projection; every other "
                 "parameter is frozen (docs/fine_tuning.md)")
      ->check(integer_in(1, kMaxModelWidth));
  app.add_option("--lora-alpha", config.lora_alpha, "LoRA's alpha: the adapters are scaled by alpha / R (default 2 R)")
      ->check(number_in(0.0, 1e6, true));
  app.add_flag("--nf4", config.nf4,
               "With --lora and --init-from: store the frozen projections in NF4 (4-bit NormalFloat, QLoRA), "
               "gathered by FSDP as packed bytes");
  app.add_flag("--overwrite", config.overwrite,
               "Replace output files an earlier launch left (--log-json of a fresh run, --trace, --export, "
               "--loss-plot, --sweep-out, --sweep-svg); never an input, never a checkpoint");
}

// The model: a Hugging Face --init-from sets it (and its tokenizer, unless
// --tokenizer is given); otherwise the preset with the shape flags over it.
// A --tokenizer's ids set the vocabulary.
void apply_model_flags(const ModelFlags& flags, const CLI::Option& tokenizer_option, TrainConfig& config) {
  const bool from_hf = !config.init_from.empty() && is_hf_model_dir(config.init_from);
  if (from_hf && tokenizer_option.count() == 0 && holds_tokenizer(config.init_from)) {
    config.tokenizer = config.init_from;
  }
  const std::optional<ModelFamily> family_flag =
      flags.family_option->count() > 0 ? std::optional(family_from_name(flags.family)) : std::nullopt;
  const ModelFamily model_family = family_from_name(flags.family);
  const bool preset_given = flags.preset_option->count() > 0;
  if (!preset_given) config.preset = default_preset(model_family);
  const bool tokenizer_given = !config.tokenizer.empty();
  const std::optional<int64_t> vocab = tokenizer_given && !from_hf
                                           ? tokenizer_vocab(config.tokenizer, flags.vocab.option->count() > 0)
                                           : flags.vocab.given();
  const ShapeFlags shape{.n_layer = flags.n_layer.given(),
                         .n_head = flags.n_head.given(),
                         .n_embd = flags.n_embd.given(),
                         .vocab = vocab,
                         .seq_len = flags.seq_len.given(),
                         .n_kv_head = flags.n_kv_head.given(),
                         .ffn_hidden = flags.ffn_hidden.given(),
                         .vocab_padding = flags.vocab_padding.given()};
  const ModelConfig model = from_hf ? model_from_hf_dir(config.init_from, family_flag, preset_given, shape)
                                    : model_from_flags(model_family, config.preset, shape);
  if (from_hf) {
    config.preset = config.init_from;
    if (tokenizer_given) {
      const int64_t ids = Tokenizer::load(config.tokenizer).vocab_size();
      TESSERA_CHECK(ids <= vocab_size(model), "--tokenizer {} has {} ids, more than the {} of --init-from {}",
                    config.tokenizer, ids, vocab_size(model), config.init_from);
    }
  }
  config.seq_len = shape.seq_len.value_or(block_size(model));
  if (const auto* llama = std::get_if<tessera::nn::LlamaConfig>(&model)) {
    config.llama = *llama;
  } else {
    config.model = std::get<tessera::nn::GPTConfig>(model);
    config.llama.reset();
  }
}

void apply_optimization_flags(const OptimizationFlags& flags, TrainConfig& config) {
  // The default warmup shrinks for short runs; an explicit one must fit.
  if (flags.warmup_option->count() == 0) config.warmup = std::min(config.warmup, config.steps);
  config.grad_sync = flags.grad_sync == "every" ? tessera::fsdp::GradientSync::every_micro_batch
                                                : tessera::fsdp::GradientSync::last_micro_batch;
}

void apply_parallelism_flags(const ParallelismFlags& flags, TrainConfig& config) {
  config.reshard_after_forward = *parse_reshard(flags.reshard);
  config.param_dtype = parse_dtype(flags.param_dtype);
  if (!flags.reduce_dtype.empty()) config.reduce_dtype = parse_dtype(flags.reduce_dtype);
  config.device = tessera::Device::parse(flags.device);
  config.overlap_offloaded_step = flags.offload_step == "overlapped";
  read_world_size(config, flags.nproc_option->count() > 0);
}

}  // namespace

std::optional<int> parse_command_line(int argc, const char* const* argv, TrainConfig& config, std::ostream& out,
                                      std::ostream& err) {
  CLI::App app{"Trains a GPT-2 or Llama style model with tessera's FSDP on --nproc ranks (byte-level text by default)",
               "train"};
  app.option_defaults()->always_capture_default();
  CommandLineFlags flags;
  add_model_flags(app, config, flags.model);
  add_optimization_flags(app, config, flags.optimization);
  flags.tokenizer_option = add_data_flags(app, config);
  add_report_flags(app, config);
  add_parallelism_flags(app, config, flags.parallelism);
  add_plan_flags(app, config);
  add_checkpoint_flags(app, config);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return exit_after_parse_error(app, error, out, err);
  }
  try {
    apply_model_flags(flags.model, *flags.tokenizer_option, config);
    apply_optimization_flags(flags.optimization, config);
    apply_parallelism_flags(flags.parallelism, config);
    config.validate();
  } catch (const tessera::Error& error) {
    err << "train: error: " << error.what() << "\nRun with --help for more information.\n";
    return kUsageExitCode;
  }
  return std::nullopt;
}

const char* grad_sync_name(tessera::fsdp::GradientSync sync) {
  return sync == tessera::fsdp::GradientSync::every_micro_batch ? "every" : "last";
}

std::string describe(const TrainConfig& c) {
  const ModelConfig model = c.model_config();
  // A GPT's line is the one GPT runs always printed; other families name themselves.
  const std::string name =
      c.family() == ModelFamily::gpt ? c.preset : fmt::format("{} ({})", c.preset, family_name(c.family()));
  std::string mesh = c.hsdp > 1 ? fmt::format("replicate {} x shard {}", c.hsdp, c.shard_ranks())
                                : fmt::format("shard {}", c.shard_ranks());
  if (c.tp > 1) mesh += fmt::format(" x tp {}", c.tp);
  if (c.async_tp > 0) mesh += fmt::format(", async in {} chunks", c.async_tp);
  if (c.ac.mode != tessera::nn::ActivationCheckpointPolicy::Mode::off) {
    mesh += fmt::format(", activation checkpointing {}", c.ac.str());
  }
  const char* offload = !c.cpu_offload             ? ""
                        : c.overlap_offloaded_step ? ", cpu offload (optimizer step overlapped with forward)"
                                                   : ", cpu offload";
  const std::string float8_line =
      c.float8 ? "\nfloat8   every block projection in float8 (e4m3 forward, e5m2 gradients), gathered as float8; "
                 "skipped: the head and the embeddings"
               : "";
  const std::string tuning =
      c.lora_rank == 0 ? ""
                       : fmt::format("\ntune     LoRA rank {} (alpha {:g}) on every block projection, everything else "
                                     "frozen{}",
                                     c.lora_rank, c.lora_scale_alpha(),
                                     c.nf4 ? ", the projections in NF4 (QLoRA)" : "");
  return fmt::format(
      "model    {}: {} ({:.3f} M parameters)\n"
      "batch    {} x {} tokens x {} micro-batches{} x {} {} = {} tokens per step, {} steps\n"
      "optim    AdamW lr {:g} (warmup {}, cosine to {:g}), weight decay {:g}, clip {}\n"
      "fsdp     {} on {} {} rank{} (mesh {}), reshard_after_forward {}, param {}, reduce {}{}\n"
      "device   {}\n"
      "seed     {}",
      name, describe_shape(model), static_cast<double>(num_parameters(model)) / 1e6, c.batch, c.seq_len, c.grad_accum,
      c.grad_accum > 1 ? fmt::format(" (synced {})", grad_sync_name(c.grad_sync)) : "", c.data_ranks(),
      c.tp > 1 ? "data ranks (tp groups)" : "ranks", c.tokens_per_step(),
      c.steps, c.lr, c.warmup, c.lr * c.min_lr_ratio, c.weight_decay,
      c.clip > 0.0 ? fmt::format("{:g}", c.clip) : "off",
      std::string(c.hsdp > 1 ? "HSDP" : "FSDP") + (c.tp > 1 ? " x TP" : ""), c.nproc, c.backend,
      c.nproc == 1 ? "" : "s", mesh, c.reshard_after_forward.to_string(), tessera::dtype_name(c.param_dtype),
      tessera::dtype_name(c.reduce_dtype.value_or(c.param_dtype)),
      std::string(c.deterministic ? ", deterministic" : "") + offload,
      c.device.is_cuda() && c.nproc > 1
          ? fmt::format("cuda:0 to cuda:{}, one per rank; {}", c.nproc - 1, tessera::describe_device(c.device))
          : tessera::describe_device(c.device),
      c.seed) + float8_line + tuning;
}

tessera::fsdp::FullyShardOptions fully_shard_options(const TrainConfig& config, bool root,
                                                     std::optional<tessera::dist::DeviceMesh> mesh) {
  return {.mesh = std::move(mesh),
          .reshard_after_forward = root ? std::nullopt : std::optional(config.reshard_after_forward),
          .mp_policy = {.param_dtype = config.param_dtype,
                        .reduce_dtype = config.reduce_dtype,
                        .output_dtype = std::nullopt,
                        .cast_forward_inputs = true},
          .offload_policy = config.cpu_offload ? std::optional(tessera::fsdp::CPUOffloadPolicy{}) : std::nullopt,
          .ignored_params = {}};
}

}  // namespace tessera::train
