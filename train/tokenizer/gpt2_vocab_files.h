// GPT-2's own tokenizer files: encoder.json (Hugging Face calls it
// vocab.json: token text in the byte alphabet -> id) and merges.txt (an
// optional "#version" line, then one merge a line, "a b", in rank order).
// The pre-tokenizer is GPT-2's regex; there are no added tokens, so
// "<|endoftext|>" in a text is encoded as text, as with Hugging Face's
// BPE.from_file and a ByteLevel pre-tokenizer. tokenizer.json writes its
// vocab and its older merges the same way (tokenizer_json.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "train/tokenizer/tokenizer_spec.h"

namespace tessera::train {

// Parses the two files' texts; errors (tessera::Error) name the file and,
// for merges.txt, the line.
TokenizerSpec read_gpt2_vocab_files(std::string_view vocab_json, const std::string& vocab_source,
                                    std::string_view merges_txt, const std::string& merges_source);

// A vocab object {"token": id, ...}; `where` names it in errors ("vocab.json",
// "tokenizer.json: model.vocab"). Ids must be integers in [0, kMaxTokenId].
std::vector<std::pair<std::string, uint32_t>> vocab_from_json(const nlohmann::json& vocab, const std::string& where);

// "a b" -> {a, b}; nullopt unless the text holds exactly one space with
// text on both sides.
std::optional<std::pair<std::string, std::string>> split_merge(std::string_view text);

}  // namespace tessera::train
