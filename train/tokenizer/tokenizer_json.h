// Hugging Face `tokenizers`' tokenizer.json, for byte-level BPE models (GPT-2
// and Llama 3 style). Read: model (type BPE: vocab, merges as "a b" strings
// or [a, b] pairs, ignore_merges), pre_tokenizer (ByteLevel, with or without
// its GPT-2 regex, or a Sequence of Split by GPT-2's or Llama 3's regex,
// behavior Isolated, then ByteLevel without regex), added_tokens, decoder
// (ByteLevel). Refused, with the key named: another model type, dropout, a
// subword prefix or suffix, byte_fallback, any normalizer, an unknown
// pre-tokenizer or regex, add_prefix_space, a decoder other than ByteLevel,
// truncation or padding, added tokens with single_word, lstrip or rstrip.
// The post_processor is not read: it acts only when special tokens are
// added, and encode adds none (Hugging Face's add_special_tokens=False).
#pragma once

#include <string>
#include <string_view>

#include "train/tokenizer/tokenizer_spec.h"

namespace tessera::train {

// Parses the file's text; `source` names it in errors (tessera::Error).
TokenizerSpec read_tokenizer_json(std::string_view text, const std::string& source);

}  // namespace tessera::train
