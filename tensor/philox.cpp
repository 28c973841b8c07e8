// The per-thread default generator and name-derived stream ids (Philox itself
// is inline in the header).
#include "tensor/philox.h"

namespace tessera {

Generator& default_generator() {
  thread_local Generator generator(0);
  return generator;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

uint64_t stream_id_for(const char* name, uint64_t salt) {
  uint64_t hash = 0xcbf29ce484222325ull ^ salt;
  for (const char* c = name; *c != '\0'; ++c) {
    hash ^= static_cast<unsigned char>(*c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

}  // namespace tessera
