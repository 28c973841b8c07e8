// fsdp::CPUOffloadPolicy: FSDP2's CPU offload. The parameter shards, their
// gradients and the optimizer's state stay in host memory, so a GPU holds
// only what a step needs at the moment: the gathered units, activations and
// workspace. The mesh's cuda device computes:
//
//   unshard     the copy-in stream copies this rank's shards host-to-device
//               straight into its all-gather slot (asynchronous from pinned
//               memory), then the all-gather runs as without offload;
//   backward    each group's reduced gradients are copied device-to-host as
//               soon as their reduce-scatter (and HSDP's all-reduce) is done,
//               on the reduce-scatter stream, into a page-locked buffer the
//               group keeps; the end of backward waits for those copies and
//               accumulates them into the host gradients;
//   optimizer   any optim:: optimizer steps the host shards with the cpu
//               kernels (AdamW's vectorised one), or, overlapped with the
//               next forward group by group, offloaded_optimizer_step.h.
//
// The host writes a shard only after the end of a backward (the optimizer)
// or load_full_state_dict, both of which wait for every copy that reads it.
#pragma once

namespace tessera::fsdp {

struct CPUOffloadPolicy {
  // Page-locked shards: their copies to the device run asynchronously.
  // False keeps them in pageable memory, where each copy is staged and the
  // host waits for it (less pinned memory, no overlap).
  bool pin_memory = true;
};

}  // namespace tessera::fsdp
