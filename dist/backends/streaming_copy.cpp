// Streaming copies with AVX-512 or SSE2 non-temporal stores; the destination is
// aligned to a cache line first so every streamed store fills a whole line.
#include "dist/backends/streaming_copy.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace tessera::dist {

namespace {

constexpr int64_t kLine = 64;

int64_t last_level_cache_bytes() {
  long bytes = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
  bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  return bytes > 0 ? bytes : int64_t{32} << 20;
}

// Streams whole cache lines; `dst` is line-aligned, `bytes` a multiple of a line.
void stream_lines(char* dst, const char* src, int64_t bytes) {
#if defined(__AVX512F__)
  for (int64_t i = 0; i < bytes; i += kLine) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
  }
#elif defined(__SSE2__)
  for (int64_t i = 0; i < bytes; i += kLine) {
    for (int64_t j = 0; j < kLine; j += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + j),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + j)));
    }
  }
#else
  std::memcpy(dst, src, static_cast<size_t>(bytes));
#endif
}

}  // namespace

bool should_stream(int64_t bytes) {
  static const int64_t threshold = last_level_cache_bytes();
  return bytes > threshold;
}

void copy_streaming(void* dst, const void* src, int64_t bytes) {
  char* to = static_cast<char*>(dst);
  const char* from = static_cast<const char*>(src);
  const int64_t head = std::min<int64_t>(bytes, (kLine - reinterpret_cast<uintptr_t>(to) % kLine) % kLine);
  std::memcpy(to, from, static_cast<size_t>(head));
  const int64_t body = (bytes - head) / kLine * kLine;
  stream_lines(to + head, from + head, body);
  std::memcpy(to + head + body, from + head + body, static_cast<size_t>(bytes - head - body));
}

void streaming_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace tessera::dist
