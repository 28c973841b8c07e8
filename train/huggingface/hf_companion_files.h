// What a Hugging Face export carries beside its weights, so that the export
// generates as its source did: config.json's token ids, generation_config.json
// (where transformers' generate reads the ids it stops at) and the tokenizer's
// files (for AutoTokenizer.from_pretrained and `generate --init-from DIR`).
// They come from the run's sources: the Hugging Face directory the model was
// initialised from, and the run's tokenizer. A byte-level run has neither:
// its export keeps null ids and gets no tokenizer files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/huggingface/hf_config.h"
#include "train/model_family.h"

namespace tessera::train {

inline constexpr const char* kHfGenerationConfigFile = "generation_config.json";
inline constexpr const char* kHfTokenizerConfigFile = "tokenizer_config.json";

// The tokenizer files transformers reads from a model directory; an export
// copies whichever its tokenizer's directory has.
inline constexpr const char* kHfTokenizerFiles[] = {
    "tokenizer.json", kHfTokenizerConfigFile, "special_tokens_map.json", "vocab.json", "merges.txt",
    "added_tokens.json", "tokenizer.model", "chat_template.jinja"};

// Where the run's model and tokenizer came from.
struct HfExportSources {
  std::string model_dir = {};  // the Hugging Face directory of --init-from; "" = none
  // The run's tokenizer (train --tokenizer, or model_dir itself when it holds
  // one): a tokenizer.json, GPT-2's vocab.json (merges.txt beside it), or a
  // directory holding either. "" = byte-level.
  std::string tokenizer = {};
};

// One file of the export beside config.json and the weights.
struct HfExportFile {
  std::string name;    // in the export directory
  std::string bytes;   // its content
  std::string source;  // the file it was read from, or what wrote it, for messages
};

struct HfCompanions {
  HfTokenIds token_ids;             // for config.json
  std::vector<HfExportFile> files;  // generation_config.json and the tokenizer's files
};

// What the export of a model of `config` carries from `sources`. Throws
// tessera::Error naming the file and key when a source's JSON is malformed or
// a token id is outside [0, vocab_size).
HfCompanions hf_companions(const ModelConfig& config, const HfExportSources& sources);

// The ids `generate` stops at for model directory `dir` (a model of
// `vocab_size` ids): generation_config.json's eos_token_id when it has one,
// as transformers' generate reads it, else config.json's. Empty: none known.
std::vector<int64_t> hf_end_of_text_ids(const std::string& dir, int64_t vocab_size);

}  // namespace tessera::train
