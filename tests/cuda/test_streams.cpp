// Simulated cuda streams and events, and the stream-ordering checker: work on
// two streams that touches the same bytes must be ordered by an event or a
// host synchronize, or the second operation is refused with both named.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tensor/cuda/sim/schedule_recorder.h"
#include "tensor/cuda/sim/sim_stream.h"
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

}  // namespace

TEST_CASE("a cross-stream read without an event is refused, naming both operations and streams") {
  const int n = 64;
  DeviceBuffer<float> x(ramp(n)), y(n), z(n);
  auto producer = Stream::create(kCuda), consumer = Stream::create(kCuda);
  simulator_kernels::reverse_in_shared(x.get(), y.get(), n, producer.get());  // writes y
  try {
    simulator_kernels::reverse_in_shared(y.get(), z.get(), n, consumer.get());  // reads y: unordered
    FAIL("the unordered read was accepted");
  } catch (const Error& error) {
    const std::string message = error.what();
    CAPTURE(message);
    CHECK(message.find("stream-order checker") != std::string::npos);
    CHECK(message.find("`reverse_kernel` on cuda:0 stream") != std::string::npos);
    CHECK(message.find("reads `in`") != std::string::npos);
    CHECK(message.find("wrote (as `out`)") != std::string::npos);
    CHECK(message.find("record an Event on") != std::string::npos);
  }
  producer->synchronize();
  consumer->synchronize();
}

TEST_CASE("an event, or a host synchronize, orders the streams") {
  const int n = 128;
  DeviceBuffer<float> x(ramp(n)), y(n), z(n), w(ramp(n));
  auto producer = Stream::create(kCuda), consumer = Stream::create(kCuda, -1);
  CHECK(consumer->priority() == -1);

  simulator_kernels::reverse_in_shared(x.get(), y.get(), n, producer.get());
  Event produced;
  produced.record(*producer);
  consumer->wait_event(produced);
  simulator_kernels::reverse_in_shared(y.get(), z.get(), n, consumer.get());
  // The consumer reads y; the producer may only overwrite it once ordered after that read.
  CHECK_THROWS_WITH_AS(simulator_kernels::reverse_in_shared(w.get(), y.get(), n, producer.get()),
                       doctest::Contains("writes `out`"), Error);
  consumer->synchronize();  // the host has now seen the read finish...
  CHECK(z.read() == ramp(n));  // reversed twice
  CHECK_NOTHROW(simulator_kernels::reverse_in_shared(w.get(), y.get(), n, producer.get()));  // ...so this is ordered
  producer->synchronize();
}

TEST_CASE("an event the host saw complete orders later work on any stream") {
  const int n = 32;
  DeviceBuffer<float> x(ramp(n)), y(n), z(n);
  auto first = Stream::create(kCuda), second = Stream::create(kCuda);
  simulator_kernels::reverse_in_shared(x.get(), y.get(), n, first.get());
  Event done;
  done.record(*first);
  while (!done.query()) std::this_thread::yield();
  CHECK_NOTHROW(simulator_kernels::reverse_in_shared(y.get(), z.get(), n, second.get()));
  second->synchronize();
  CHECK(z.read() == ramp(n));
}

TEST_CASE("a synchronize that reports an error has still waited: later work is ordered after the stream's") {
  const int n = 32;
  DeviceBuffer<float> x(ramp(n)), y(n), z(n);
  auto first = Stream::create(kCuda), second = Stream::create(kCuda);
  simulator_kernels::reverse_in_shared(x.get(), y.get(), n, first.get());  // writes y
  first->enqueue([] { fail("a host function that fails"); });
  CHECK_THROWS_WITH_AS(first->synchronize(), doctest::Contains("a host function that fails"), Error);
  CHECK_NOTHROW(simulator_kernels::reverse_in_shared(y.get(), z.get(), n, second.get()));  // reads y
  second->synchronize();
  CHECK(z.read() == ramp(n));
}

TEST_CASE("jitter mode: a chain of kernels ping-ponging between streams stays correct and the checker silent") {
  cuda::sim::set_stream_jitter(7, 300);
  const int n = 96;
  DeviceBuffer<float> a(ramp(n)), b(n);
  auto left = Stream::create(kCuda), right = Stream::create(kCuda);
  for (int round = 0; round < 10; ++round) {
    Stream& from = round % 2 == 0 ? *left : *right;
    Stream& to = round % 2 == 0 ? *right : *left;
    simulator_kernels::reverse_in_shared(a.get(), b.get(), n, &from);
    Event handed_over;
    handed_over.record(from);
    to.wait_event(handed_over);
    simulator_kernels::reverse_in_shared(b.get(), a.get(), n, &to);
    Event handed_back;
    handed_back.record(to);
    from.wait_event(handed_back);
  }
  left->synchronize();
  right->synchronize();
  cuda::sim::set_stream_jitter(0, 0);
  CHECK(a.read() == ramp(n));
}

TEST_CASE("streams run asynchronously to the host; query, elapsed time and the current stream") {
  auto stream = Stream::create(kCuda);
  std::atomic<bool> release{false};
  stream->enqueue([&] {
    while (!release.load()) std::this_thread::yield();
  });
  Event start = Event::timed(), stop = Event::timed();
  start.record(*stream);
  stream->enqueue([] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  stop.record(*stream);
  CHECK_FALSE(stream->query());
  CHECK_FALSE(stop.query());
  release = true;
  stop.synchronize();
  stream->synchronize();  // the event completes inside its task: the stream is idle once that task returns
  CHECK(stream->query());
  // Simulated time: one operation (the host function), not the 20 ms it slept (test_runtime_rules.cpp).
  CHECK(start.elapsed_ms(stop) == doctest::Approx(cuda::sim::kMicrosecondsPerOperation / 1000.0));
  CHECK_THROWS_WITH_AS(Event::timed().elapsed_ms(stop), doctest::Contains("never recorded"), Error);

  // Each thread has its own current cuda stream; a guard replaces it for a while.
  const std::shared_ptr<Stream> mine = current_stream(kCuda);
  CHECK(mine->device() == kCuda);
  CHECK(current_stream(kCuda) == mine);
  std::shared_ptr<Stream> other_thread;
  std::thread([&] { other_thread = current_stream(kCuda); }).join();
  CHECK(other_thread != mine);
  {
    StreamGuard guard(stream);
    CHECK(current_stream(kCuda) == stream);
  }
  CHECK(current_stream(kCuda) == mine);
  DeviceBuffer<float> small(8);
  CHECK_THROWS_WITH_AS(simulator_kernels::write_past_end(small.get(), 8, Stream::default_stream(kCPU).get()),
                       doctest::Contains("on a cpu stream"), Error);
}

TEST_CASE("a ScheduleRecording writes down each stream's work, events and host waits in the host's order") {
  const int n = 256;
  DeviceBuffer<float> x(ramp(n)), y(n), z(n);
  auto producer = Stream::create(kCuda), consumer = Stream::create(kCuda);
  std::vector<cuda::sim::ScheduledOp> ops;
  {
    cuda::sim::ScheduleRecording recording;
    simulator_kernels::reverse_in_shared(x.get(), y.get(), n, producer.get());
    Event produced;
    produced.record(*producer);
    consumer->wait_event(produced);
    simulator_kernels::reverse_in_shared(y.get(), z.get(), n, consumer.get());
    consumer->synchronize();
    producer->synchronize();
    ops = recording.device(0);
    CHECK(recording.device(1).empty());
    CHECK_THROWS_WITH_AS(cuda::sim::ScheduleRecording(), doctest::Contains("already recording; one at a time"), Error);
  }
  using Kind = cuda::sim::ScheduledOp::Kind;
  REQUIRE(ops.size() == 8);
  const std::vector<Kind> kinds = {Kind::kernel, Kind::record, Kind::wait,      Kind::kernel,   Kind::record,
                                   Kind::host_wait, Kind::record, Kind::host_wait};
  for (size_t i = 0; i < kinds.size(); ++i) CHECK(ops[i].kind == kinds[i]);
  CHECK(ops[0].name == "reverse_kernel");
  CHECK(ops[0].stream == 0);
  CHECK(ops[3].stream == 1);
  CHECK(ops[2].event == ops[1].event);  // the consumer waits for the producer's record
  CHECK(ops[5].event == ops[4].event);  // the host waits for the consumer's end
  CHECK(ops[4].stream == 1);
  CHECK(ops[6].stream == 0);
  // What the stream counted when it ran each kernel: n floats read and n written.
  CHECK(ops[0].device_bytes == 2 * n * 4);
  CHECK(ops[3].device_bytes == 2 * n * 4);
  CHECK(ops[0].shared_bytes > 0);
  // Nothing is recorded once the recording is gone.
  simulator_kernels::reverse_in_shared(x.get(), y.get(), n, producer.get());
  producer->synchronize();
  cuda::sim::ScheduleRecording again;
  CHECK(again.device(0).empty());
}
