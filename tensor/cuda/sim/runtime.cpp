// The simulator as the cuda device's runtime.
#include "tensor/cuda/runtime.h"

#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "tensor/cuda/sim/architecture.h"
#include "tensor/cuda/sim/device_heap.h"
#include "tensor/cuda/sim/schedule_recorder.h"
#include "tensor/cuda/sim/sim_stream.h"
#include "tensor/cuda/sim/stream_order_checker.h"
#include "tensor/error.h"

namespace tessera::cuda {

const char* runtime_name() { return "sim"; }

std::string describe_device(int index) {
  return fmt::format("the SIMT simulator on the CPU, SIMULATED (no GPU runs this; cuda:{} checked against {}'s limits, "
                     "{:.1f} GiB device heap)",
                     index, sim::target_architecture().name,
                     static_cast<double>(sim::device_capacity(index)) / (1 << 30));
}
bool has_fp8_gemm(int) { return std::string_view(sim::target_architecture().name) != "sm_80"; }

namespace {
thread_local int t_current_device = 0;
}  // namespace

int device_count() { return sim::kMaxDevices; }
void check_device_index(int index) {
  TESSERA_CHECK(index >= 0 && index < sim::kMaxDevices,
                "there is no cuda:{}: the simulator has {} devices, cuda:0 to cuda:{}", index, sim::kMaxDevices,
                sim::kMaxDevices - 1);
}
void set_device(int index) {
  sim::check_not_in_host_function("cudaSetDevice");
  check_device_index(index);
  t_current_device = index;
}
int current_device() { return t_current_device; }

std::shared_ptr<Stream> create_stream(Device device, int priority) { return sim::SimStream::create(device, priority); }

void* device_malloc(int device, int64_t bytes) {
  sim::check_not_in_host_function("cudaMalloc");
  return sim::device_malloc(device, bytes);
}
void device_free(int device, void* pointer) {
  sim::check_not_in_host_function("cudaFree");
  TESSERA_CHECK(sim::device_of_address(pointer) == device, "cuda sim: cudaFree on cuda:{} of {}", device,
                sim::describe_device_address(pointer, 1));
  sim::device_free(pointer);
}

void* pinned_host_malloc(int64_t bytes) {
  sim::check_not_in_host_function("cudaHostAlloc");
  void* pointer = std::aligned_alloc(64, static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64));
  TESSERA_CHECK(pointer != nullptr, "cuda sim: out of host memory for a {}-byte pinned buffer", bytes);
  return pointer;
}
void pinned_host_free(void* pointer) {
  sim::check_not_in_host_function("cudaFreeHost");
  std::free(pointer);
}

void* mapped_host_malloc(int64_t bytes) {
  sim::check_not_in_host_function("cudaHostAlloc");
  void* pointer = sim::mapped_malloc(bytes);
  TESSERA_CHECK(pointer != nullptr, "cuda sim: out of mapped host memory for a {}-byte record", bytes);
  sim::mark_device_written(pointer, bytes);  // host memory: the host writes it directly, and initcheck is the device's
  return pointer;
}

void check_host_access(const void* data, int64_t bytes, bool writes, const char* operation) {
  sim::StreamOrderChecker::instance().check_host_access(
      operation, {{"host memory", data, bytes, writes ? BufferAccess::write : BufferAccess::read}});
}

void memcpy_async(void* dst, const void* src, int64_t bytes, CopyKind kind, Stream& stream) {
  const sim::RuntimeCall call("cudaMemcpyAsync");
  auto* sim_stream = dynamic_cast<sim::SimStream*>(&stream);
  TESSERA_CHECK(sim_stream != nullptr, "cuda sim: memcpy_async on a {} stream (copies run on cuda streams)",
                stream.device().str());
  if (bytes == 0) return;
  std::vector<BufferUse> device_side;
  const char* operation = "memcpy device to device";
  if (kind != CopyKind::host_to_device) device_side.push_back({"source", src, bytes, BufferAccess::read});
  if (kind != CopyKind::device_to_host) device_side.push_back({"destination", dst, bytes, BufferAccess::write});
  if (kind == CopyKind::host_to_device) operation = "memcpy host to device";
  if (kind == CopyKind::device_to_host) operation = "memcpy device to host";
  sim::check_device_buffers(operation, stream.device().index, device_side);
  // The host side is recorded too, so that the host's own reads and writes
  // of it can be checked against the copy (check_host_access).
  std::vector<BufferUse> both_sides = device_side;
  if (kind == CopyKind::host_to_device) both_sides.push_back({"host source", src, bytes, BufferAccess::read});
  if (kind == CopyKind::device_to_host) both_sides.push_back({"host destination", dst, bytes, BufferAccess::write});
  sim::StreamOrderChecker::instance().check_and_record(sim_stream->checker_id(), operation, both_sides);
  sim::schedule_op(stream, {.kind = sim::ScheduledOp::Kind::copy, .name = operation, .bytes = bytes});
  stream.enqueue([dst, src, bytes, kind] {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    if (kind == CopyKind::host_to_device) sim::mark_device_written(dst, bytes);
    if (kind == CopyKind::device_to_device) sim::copy_device_written_state(dst, src, bytes);
  });
}

}  // namespace tessera::cuda
