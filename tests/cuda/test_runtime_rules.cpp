// CUDA's rules the simulator enforces and tessera's runtime keeps: no CUDA
// call inside a host function (a Stream::enqueue task), no host function in
// tessera's own work (kernels, copies, frees, event records), and event
// timing read from the device's clock, not from host callbacks.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tensor/cuda/pinned_pool.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda/sim/sim_stream.h"
#include "tensor/error.h"
#include "tensor/host_staging.h"
#include "tensor/ops.h"
#include "tensor/stream.h"
#include "tests/cuda/device_buffer.h"
#include "tests/cuda/simulator_kernels.h"

using namespace tessera;

namespace {

const Device kCuda(DeviceType::cuda);

std::vector<float> ramp(int n) {
  std::vector<float> values(n);
  for (int i = 0; i < n; ++i) values[i] = static_cast<float>(i);
  return values;
}

// Runs `call` inside a host function on a fresh stream and returns what the
// stream's synchronize raised ("" when nothing).
std::string error_inside_host_function(const std::function<void()>& call) {
  auto stream = Stream::create(kCuda);
  stream->enqueue(call);
  try {
    stream->synchronize();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a CUDA call inside a host function is an error naming the call, as the GPU refuses it") {
  const int n = 64;
  DeviceBuffer<float> x(ramp(n)), y(n);
  auto other = Stream::create(kCuda);
  Event recorded;
  recorded.record(*other);
  void* block = cuda::device_malloc(0, 256);
  std::vector<float> host(n, 1.0f);
  const std::vector<float> untouched = y.read();

  const struct {
    const char* api;
    std::function<void()> call;
  } cases[] = {
      {"cudaLaunchKernel", [&] { simulator_kernels::reverse_in_shared(x.get(), y.get(), n, other.get()); }},
      {"cudaMemcpyAsync",
       [&] { cuda::memcpy_async(y.get(), host.data(), n * 4, cuda::CopyKind::host_to_device, *other); }},
      {"cudaMalloc", [] { cuda::device_malloc(0, 256); }},
      {"cudaFree", [&] { cuda::device_free(0, block); }},
      {"cudaEventRecord", [&] { Event().record(*other); }},
      {"cudaEventQuery", [&] { recorded.query(); }},
      {"cudaEventSynchronize", [&] { recorded.synchronize(); }},
      {"cudaStreamSynchronize", [&] { other->synchronize(); }},
      {"cudaStreamQuery", [&] { other->query(); }},
      {"cudaStreamWaitEvent", [&] { other->wait_event(recorded); }},
      {"cudaLaunchHostFunc", [&] { other->enqueue([] {}); }},
  };
  for (const auto& c : cases) {
    CAPTURE(c.api);
    const std::string message = error_inside_host_function(c.call);
    CHECK(message.find(std::string(c.api) + " inside a host function") != std::string::npos);
    CHECK(message.find("cudaErrorNotPermitted") != std::string::npos);
  }
  cuda::device_free(0, block);  // from the host it is allowed
  other->synchronize();
  CHECK(y.read() == untouched);  // the refused launch and copy never ran

  // A host function that makes no CUDA call runs, in stream order with the kernels around it.
  auto stream = Stream::create(kCuda);
  simulator_kernels::reverse_in_shared(x.get(), y.get(), n, stream.get());
  std::vector<float> seen;
  stream->enqueue([&] { seen = y.read(); });
  stream->synchronize();
  std::vector<float> reversed = ramp(n);
  std::reverse(reversed.begin(), reversed.end());
  CHECK(seen == reversed);
}

TEST_CASE("tessera's own work makes no host function: kernels, copies, GEMMs, frees and event records") {
  auto side = Stream::create(kCuda);
  const int64_t before = cuda::sim::host_functions_enqueued();
  {
    const Tensor host = ops::arange(0.0, 64.0, 1.0);
    const Tensor x = ops::reshape(ops::to(host, kCuda), {8, 8});  // upload through a pinned block
    const Tensor y = ops::linear(ops::exp(ops::mul(x, 0.01)), x, ops::to(ops::ones({8}), kCuda));
    Event done;
    done.record(*current_stream(kCuda));
    side->wait_event(done);
    CHECK(done.timing() == false);
    const Tensor pinned = pinned_empty({8, 8}, DType::f32);
    const Event copied = copy_to_host_async(pinned, y, *side);
    CHECK(ops::to(y, kCPU).to_vector<float>()[0] > 0.0f);  // a download, synchronising
    copied.synchronize();
    CHECK(pinned.to_vector<float>() == ops::to(y, kCPU).to_vector<float>());
  }  // the cuda tensors go back to the caching allocator: an event each, no callback
  for (int step = 0; step < 3; ++step) ops::to(ops::exp(ops::to(ops::ones({4, 4}), kCuda)), kCPU);
  side->synchronize();
  CHECK(cuda::sim::host_functions_enqueued() == before);
  CHECK(cuda::pinned_pool_stats().in_use_bytes == 0);  // every staging block back once its copy was seen done
}

TEST_CASE("Event::elapsed_ms on the simulator reads the simulated device clock, one step per operation") {
  const int n = 32;
  DeviceBuffer<float> x(ramp(n)), y(n);
  auto stream = Stream::create(kCuda);
  Event start = Event::timed(), stop = Event::timed();
  CHECK(start.timing());
  start.record(*stream);
  for (int i = 0; i < 3; ++i) simulator_kernels::reverse_in_shared(x.get(), y.get(), n, stream.get());
  // A host function is one operation on the stream however long it takes on the host.
  stream->enqueue([] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  stop.record(*stream);
  stop.synchronize();
  const double step_ms = static_cast<double>(cuda::sim::kMicrosecondsPerOperation) / 1000.0;
  CHECK(start.elapsed_ms(stop) == doctest::Approx(4 * step_ms));
  CHECK(stop.elapsed_ms(start) == doctest::Approx(-4 * step_ms));

  // Recorded again, an event's later record counts; an event without timing cannot be timed.
  start.record(*stream);
  simulator_kernels::reverse_in_shared(x.get(), y.get(), n, stream.get());
  stop.record(*stream);
  stream->synchronize();
  CHECK(start.elapsed_ms(stop) == doctest::Approx(step_ms));
  Event untimed;
  untimed.record(*stream);
  stream->synchronize();
  CHECK_THROWS_WITH_AS(start.elapsed_ms(untimed), doctest::Contains("the end event was made without timing"), Error);
  CHECK_THROWS_WITH_AS(Event::timed().elapsed_ms(stop), doctest::Contains("the start event was never recorded"),
                       Error);
  // A cpu stream's events keep the host's clock, which the device's cannot be compared with.
  auto cpu = Stream::create(kCPU);
  Event on_cpu = Event::timed();
  on_cpu.record(*cpu);
  cpu->synchronize();
  CHECK_THROWS_WITH_AS(start.elapsed_ms(on_cpu), doctest::Contains("different runtimes"), Error);
}
