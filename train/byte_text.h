// Text <-> byte-level tokens for `generate`: one token per byte (vocab 256,
// as the corpus loader makes them), and sampled tokens back to text that is
// safe to print: a byte model can emit control bytes and broken UTF-8.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::train {

inline constexpr int64_t kByteVocab = 256;

// Each byte of `text` as a token in [0, 256).
std::vector<uint32_t> text_to_byte_tokens(std::string_view text);

// The bytes the tokens stand for, unchanged (what `generate` writes when its
// output is not a terminal). Throws tessera::Error for a token >= 256.
std::string byte_tokens_to_bytes(std::span<const uint32_t> tokens);

// `bytes`, printable and reversible: ASCII from space to '~' (but the
// backslash), newline, tab and complete UTF-8 sequences of printable
// characters stay as they are; a backslash becomes \\ and every other byte
// \xHH, so printable_to_bytes gives the bytes back.
std::string bytes_to_printable(std::string_view bytes);

// bytes_to_printable of the bytes the tokens stand for. Throws
// tessera::Error for a token >= 256.
std::string byte_tokens_to_printable(std::span<const uint32_t> tokens);

// The inverse of byte_tokens_to_printable. Throws tessera::Error naming the
// position of a backslash that starts no escape.
std::string printable_to_bytes(std::string_view printable);

}  // namespace tessera::train
