#include "tensor/cuda/sim/stream_order_checker.h"

#include <algorithm>
#include <iterator>

#include "tensor/error.h"

namespace tessera::cuda::sim {

namespace {

void merge(StreamOrderChecker::Clock& into, const StreamOrderChecker::Clock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

bool reads(BufferAccess access) { return access != BufferAccess::write; }
bool writes(BufferAccess access) { return access != BufferAccess::read; }

}  // namespace

StreamOrderChecker& StreamOrderChecker::instance() {
  static auto* checker = new StreamOrderChecker;  // never destroyed: streams may outlive statics
  return *checker;
}

int StreamOrderChecker::add_stream(const std::string& device) {
  std::lock_guard lock(mutex_);
  names_.push_back(fmt::format("{} stream {}", device, names_.size()));
  clocks_.emplace_back();
  return static_cast<int>(names_.size()) - 1;
}

StreamOrderChecker::Clock StreamOrderChecker::clock_of(int stream) {
  std::lock_guard lock(mutex_);
  return clocks_[stream];
}

void StreamOrderChecker::stream_waits(int stream, const Clock& clock) {
  std::lock_guard lock(mutex_);
  merge(clocks_[stream], clock);
}

void StreamOrderChecker::host_learns(const Clock& clock) {
  std::lock_guard lock(mutex_);
  merge(host_, clock);
}

bool StreamOrderChecker::ordered(const Clock& clock, const Access& earlier, int stream) const {
  if (earlier.stream < 0 || earlier.stream == stream) return true;
  return static_cast<size_t>(earlier.stream) < clock.size() && clock[earlier.stream] >= earlier.tick;
}

void StreamOrderChecker::fail_unordered(int stream, const std::string& operation, const BufferUse& buffer,
                                        const char* what, const Access& earlier) const {
  fail("stream-order checker: `{}` on {} {} `{}` ({} bytes at {}), which `{}` on {} {} (as `{}`) with no event or "
       "synchronize between them: record an Event on {} after `{}` and make {} wait_event on it",
       operation, names_[stream], what, buffer.name, buffer.bytes, buffer.data, earlier.operation,
       names_[earlier.stream], std::string(what) == "reads" ? "wrote" : "accessed", earlier.buffer,
       names_[earlier.stream], earlier.operation, names_[stream]);
}

void StreamOrderChecker::check_and_record(int stream, const std::string& operation,
                                          const std::vector<BufferUse>& buffers) {
  std::lock_guard lock(mutex_);
  Clock& clock = clocks_[stream];
  merge(clock, host_);
  if (clock.size() <= static_cast<size_t>(stream)) clock.resize(stream + 1, 0);
  const uint64_t tick = clock[stream] + 1;
  // Check everything first, so a refused operation records no access.
  for (const BufferUse& buffer : buffers) {
    const auto begin = reinterpret_cast<uintptr_t>(buffer.data);
    for (const Range* range : cover(begin, begin + buffer.bytes)) {
      if (!ordered(clock, range->last_write, stream)) {
        fail_unordered(stream, operation, buffer, reads(buffer.access) ? "reads" : "writes", range->last_write);
      }
      if (!writes(buffer.access)) continue;
      for (const Access& read : range->reads) {
        if (!ordered(clock, read, stream)) fail_unordered(stream, operation, buffer, "writes", read);
      }
    }
  }
  clock[stream] = tick;
  for (const BufferUse& buffer : buffers) {
    const auto begin = reinterpret_cast<uintptr_t>(buffer.data);
    const Access access{stream, tick, operation, buffer.name};
    for (Range* range : cover(begin, begin + buffer.bytes)) {
      if (writes(buffer.access)) {
        range->last_write = access;
        range->reads.clear();
        continue;
      }
      const auto same_stream = std::find_if(range->reads.begin(), range->reads.end(),
                                            [&](const Access& read) { return read.stream == stream; });
      if (same_stream != range->reads.end()) {
        *same_stream = access;
      } else {
        range->reads.push_back(access);
      }
    }
  }
}

void StreamOrderChecker::check_host_access(const std::string& operation, const std::vector<BufferUse>& buffers) {
  std::lock_guard lock(mutex_);
  constexpr int kHost = -1;  // no stream: only what host_ knows is ordered before it
  for (const BufferUse& buffer : buffers) {
    const auto begin = reinterpret_cast<uintptr_t>(buffer.data);
    auto it = ranges_.upper_bound(begin);
    if (it != ranges_.begin()) --it;
    // Only ranges a stream touched exist here: look, without splitting.
    for (; it != ranges_.end() && it->first < begin + buffer.bytes; ++it) {
      const Range& range = it->second;
      if (range.end <= begin) continue;
      if (!ordered(host_, range.last_write, kHost)) {
        fail_host_unordered(operation, buffer, reads(buffer.access) ? "reads" : "writes", range.last_write);
      }
      if (!writes(buffer.access)) continue;
      for (const Access& read : range.reads) {
        if (!ordered(host_, read, kHost)) fail_host_unordered(operation, buffer, "writes", read);
      }
    }
  }
}

void StreamOrderChecker::fail_host_unordered(const std::string& operation, const BufferUse& buffer, const char* what,
                                             const Access& earlier) const {
  fail("stream-order checker: `{}` on the host {} {} ({} bytes at {}), which `{}` on {} {} (as `{}`) with no "
       "synchronize between them: record an Event on {} after `{}` and synchronize it before the host touches the "
       "memory",
       operation, what, buffer.name, buffer.bytes, buffer.data, earlier.operation, names_[earlier.stream],
       std::string(what) == "reads" ? "wrote" : "accessed", earlier.buffer, names_[earlier.stream],
       earlier.operation);
}

void StreamOrderChecker::forget(const void* begin, int64_t bytes) {
  std::lock_guard lock(mutex_);
  const auto first = reinterpret_cast<uintptr_t>(begin), last = first + bytes;
  split_at(first);
  split_at(last);
  ranges_.erase(ranges_.lower_bound(first), ranges_.lower_bound(last));
}

void StreamOrderChecker::split_at(uintptr_t address) {
  auto it = ranges_.upper_bound(address);
  if (it == ranges_.begin()) return;
  --it;
  if (it->first == address || it->second.end <= address) return;
  Range upper = it->second;
  it->second.end = address;
  ranges_.emplace(address, std::move(upper));
}

std::vector<StreamOrderChecker::Range*> StreamOrderChecker::cover(uintptr_t begin, uintptr_t end) {
  std::vector<Range*> covering;
  if (begin >= end) return covering;
  split_at(begin);
  split_at(end);
  uintptr_t position = begin;
  auto it = ranges_.lower_bound(begin);
  while (position < end) {
    if (it == ranges_.end() || it->first > position) {
      const uintptr_t gap_end = it == ranges_.end() ? end : std::min(end, it->first);
      it = ranges_.emplace_hint(it, position, Range{gap_end, {}, {}});
    }
    covering.push_back(&it->second);
    position = it->second.end;
    ++it;
  }
  return covering;
}

}  // namespace tessera::cuda::sim
