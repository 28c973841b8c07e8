// The wire format between TcpStore clients and their TcpStoreServer: one
// request, one reply, in order, on a connection. Integers are little-endian.
//   request: op (1 byte), key length (4), value length (8), key, value
//   reply:   status (1 byte: 0 ok, 1 refused), payload length (8), payload
// get's reply carries the value (sent once the key exists: the server parks
// the request until then); add's request and reply carry an i64; check's
// reply one byte (1 when the key exists); a refusal carries its message.
// A server started with a job secret (dist/launch/job_secret.h) answers
// nothing on a connection until its first request, authenticate with the
// secret as its key and no value, is answered ok: anything else first, or a
// wrong secret, is refused and the connection closed without effect.
// A client sends its next request once the last one's reply has come.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace tessera::dist::store_protocol {

enum class Op : uint8_t { set = 1, get = 2, add = 3, check = 4, authenticate = 5 };
enum class Status : uint8_t { ok = 0, refused = 1 };

// The bounds a server enforces by default (StoreLimits can lower them), so a
// stray connection cannot make it allocate without limit; clients check them
// first and name the key.
constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint64_t kMaxValueBytes = uint64_t{64} << 20;

constexpr size_t kRequestHeaderBytes = 13;
constexpr size_t kReplyHeaderBytes = 9;

inline void put_le(std::byte* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<std::byte>(value >> (8 * i));
}

inline uint64_t get_le(const std::byte* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

struct RequestHeader {
  Op op;
  uint32_t key_bytes;
  uint64_t value_bytes;
};

inline std::array<std::byte, kRequestHeaderBytes> encode(const RequestHeader& header) {
  std::array<std::byte, kRequestHeaderBytes> out{};
  out[0] = static_cast<std::byte>(header.op);
  put_le(out.data() + 1, header.key_bytes, 4);
  put_le(out.data() + 5, header.value_bytes, 8);
  return out;
}

inline RequestHeader decode_request(std::span<const std::byte, kRequestHeaderBytes> in) {
  return {static_cast<Op>(in[0]), static_cast<uint32_t>(get_le(in.data() + 1, 4)), get_le(in.data() + 5, 8)};
}

inline std::array<std::byte, kReplyHeaderBytes> encode_reply(Status status, uint64_t payload_bytes) {
  std::array<std::byte, kReplyHeaderBytes> out{};
  out[0] = static_cast<std::byte>(status);
  put_le(out.data() + 1, payload_bytes, 8);
  return out;
}

}  // namespace tessera::dist::store_protocol
