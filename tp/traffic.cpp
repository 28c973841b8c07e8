// What tensor parallelism sends, from the model's shape: the plans' moves
// counted as the tp group's stats count them.
#include "tp/traffic.h"

#include "nn/models/gpt.h"
#include "nn/models/llama.h"
#include "tp/collective_matmul.h"

namespace tessera::tp {

namespace {

// `times` collectives of `kind` moving `bytes` each (a rank's chunk for the
// all-gathers and reduce-scatters, the whole tensor for the all-reduces).
void add(dist::CommStats& stats, dist::CollectiveKind kind, int64_t bytes, int ranks, int64_t times = 1) {
  const dist::CommVolume volume = dist::collective_volume(kind, bytes, ranks, /*is_root=*/false);
  dist::CollectiveStats& entry = stats[kind];
  entry.calls += times;
  entry.bytes_sent += volume.sent * times;
  entry.bytes_received += volume.received * times;
}

// `calls` collectives of `kind` moving `bytes` in all (chunks of one tensor:
// the volume of an all-gather or reduce-scatter is linear in its bytes).
void add_chunked(dist::CommStats& stats, dist::CollectiveKind kind, int64_t bytes, int ranks, int64_t calls) {
  const dist::CommVolume volume = dist::collective_volume(kind, bytes, ranks, /*is_root=*/false);
  dist::CollectiveStats& entry = stats[kind];
  entry.calls += calls;
  entry.bytes_sent += volume.sent;
  entry.bytes_received += volume.received;
}

}  // namespace

TensorParallelTraffic plan_traffic(const nn::CausalLM& model, const TrafficShape& shape) {
  int ranks = 0;
  std::vector<int64_t> partial_gradient_bytes;
  for (const auto& [name, parameter] : model.named_parameters()) {
    const auto& spec = parameter->tensor_parallel();
    TESSERA_CHECK(spec != nullptr, "tp::plan_traffic: {} of the {} is not laid out for tensor parallelism; "
                  "parallelize the model first", name, model.type_name());
    ranks = static_cast<int>(spec->mesh.size());
    if (spec->partial_gradient && parameter->requires_grad()) {
      partial_gradient_bytes.push_back(shape_numel(spec->global_shape) *
                                       static_cast<int64_t>(element_size(parameter->tensor().dtype())));
    }
  }
  const auto* gpt = dynamic_cast<const nn::GPT*>(&model);
  const auto* llama = dynamic_cast<const nn::Llama*>(&model);
  TESSERA_CHECK(gpt != nullptr || llama != nullptr, "tp::plan_traffic: the plans are GPT's and Llama's, not a {}'s",
                model.type_name());
  const int64_t layers = gpt ? gpt->config().n_layer : llama->config().n_layer;
  const int64_t width = gpt ? gpt->config().n_embd : llama->config().n_embd;
  TESSERA_CHECK(shape.batch >= 1 && shape.seq_len >= 1 && shape.seq_len % ranks == 0,
                "tp::plan_traffic: batch {} and sequence length {} (divisible by the tp size {})", shape.batch,
                shape.seq_len, ranks);
  const auto activation_element = static_cast<int64_t>(element_size(shape.activation_dtype));
  // A rank's [B, T/tp, C] slice of the residual stream.
  const int64_t slice = shape.batch * shape.seq_len / ranks * width * activation_element;
  // The loss's values a row, in the dtype the logits are computed on.
  const int64_t loss_rows = shape.batch * shape.seq_len *
                            static_cast<int64_t>(element_size(compute_dtype(shape.activation_dtype)));

  TESSERA_CHECK(shape.async_chunks >= 0, "tp::plan_traffic: async_chunks must be >= 0, got {}", shape.async_chunks);
  // A block's moves in and out: whole, or (async) in chunks of the batch.
  const int64_t pieces = shape.async_chunks > 0 ? collective_chunks(shape.batch, shape.async_chunks) : 1;
  const int64_t gathers_per_block = 2 * pieces;  // Llama's one gather feeds several products (gather_sequence_into)
  const int64_t scatters_per_block = 2 * pieces;
  TensorParallelTraffic traffic;
  // In: the embedding's sum onto the sequence; per block into and out of
  // attention and the MLP; into the head; the loss.
  for (dist::CommStats* pass : {&traffic.forward, &traffic.backward}) {
    // Back: each move's conjugate (a gather's is a scatter, and the other way round).
    const bool forward = pass == &traffic.forward;
    add_chunked(*pass, dist::CollectiveKind::reduce_scatter, (2 * layers + 1) * slice, ranks,
                1 + layers * (forward ? scatters_per_block : gathers_per_block));
    add_chunked(*pass, dist::CollectiveKind::all_gather, (2 * layers + 1) * slice, ranks,
                1 + layers * (forward ? gathers_per_block : scatters_per_block));
  }
  add(traffic.forward, dist::CollectiveKind::all_reduce, loss_rows, ranks, 3);
  for (const auto& block : model.blocks()) {
    if (!block->activation_checkpointing()) continue;
    add_chunked(traffic.backward, dist::CollectiveKind::all_gather, 2 * slice, ranks, gathers_per_block);
    add_chunked(traffic.backward, dist::CollectiveKind::reduce_scatter, 2 * slice, ranks, scatters_per_block);
  }
  if (gpt) {  // the gradient of each rank's position rows [T/tp, C], gathered back to the whole table's use
    add(traffic.backward, dist::CollectiveKind::all_gather, shape.seq_len / ranks * width * activation_element, ranks);
  }
  if (!shape.fsdp_sums_partial_gradients) {
    for (int64_t bytes : partial_gradient_bytes) add(traffic.backward, dist::CollectiveKind::all_reduce, bytes, ranks);
  }
  return traffic;
}

}  // namespace tessera::tp
