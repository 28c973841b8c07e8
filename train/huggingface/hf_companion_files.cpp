// The export's token ids, generation_config.json and tokenizer files, read from the run's sources.
#include "train/huggingface/hf_companion_files.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string_view>

#include "checkpoint/file_io.h"
#include "tensor/error.h"
#include "train/huggingface/hf_checkpoint.h"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

// End-of-text tokens by their names in GPT-2's and Llama 3's vocabularies.
constexpr std::string_view kGpt2EndOfText = "<|endoftext|>";
constexpr std::string_view kLlama3EndOfText = "<|end_of_text|>";
constexpr const char* kWrittenHere = "written by tessera's export";

struct EndOfText {
  std::string content;
  int64_t id = 0;
};

nlohmann::ordered_json parse_json(const std::string& text, const std::string& source) {
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    tessera::fail("{}: not valid JSON: {}", source, error.what());
  }
}

HfExportFile read_export_file(const std::string& name, const fs::path& path) {
  return {name, tessera::checkpoint::read_file_text(path.string()), path.string()};
}

const HfExportFile* find_file(const std::vector<HfExportFile>& files, std::string_view name) {
  for (const HfExportFile& file : files) {
    if (file.name == name) return &file;
  }
  return nullptr;
}

// The tokenizer's files, in any form Tokenizer::load reads, under their names in a Hugging Face directory.
std::vector<HfExportFile> read_tokenizer_files(const std::string& tokenizer) {
  const fs::path path(tokenizer);
  std::error_code error;
  if (fs::is_directory(path, error)) {
    std::vector<HfExportFile> files;
    for (const char* name : kHfTokenizerFiles) {
      if (fs::is_regular_file(path / name, error)) files.push_back(read_export_file(name, path / name));
    }
    // encoder.json, GPT-2's first name for vocab.json, is read by Tokenizer::load; transformers reads vocab.json.
    if (!find_file(files, "vocab.json") && fs::is_regular_file(path / "encoder.json", error)) {
      files.push_back(read_export_file("vocab.json", path / "encoder.json"));
    }
    return files;
  }
  const std::string name = path.filename().string();
  if (name == "vocab.json" || name == "encoder.json") {
    return {read_export_file("vocab.json", path), read_export_file("merges.txt", path.parent_path() / "merges.txt")};
  }
  return {read_export_file("tokenizer.json", path)};  // a tokenizer.json by any name
}

// The tokenizer's end-of-text token, by GPT-2's or Llama 3's name: an added
// token of tokenizer.json, or the entry of GPT-2's vocab.json (which has no
// added tokens and lists <|endoftext|> among its merged ones). Throws
// tessera::Error when its id is outside the model's [0, vocab_size).
std::optional<EndOfText> end_of_text_token(const std::vector<HfExportFile>& files, int64_t vocab_size) {
  const auto checked = [&](const std::string& content, const nlohmann::ordered_json& id, const HfExportFile& file) {
    TESSERA_CHECK(id.is_number_unsigned() && id.get<uint64_t>() < static_cast<uint64_t>(vocab_size),
                  "{}: end-of-text token {} has id {}, outside the model's vocabulary [0, {})", file.source, content,
                  id.dump(), vocab_size);
    return EndOfText{content, id.get<int64_t>()};
  };
  if (const HfExportFile* file = find_file(files, "tokenizer.json")) {
    const nlohmann::ordered_json json = parse_json(file->bytes, file->source);
    const auto added = json.find("added_tokens");
    if (added == json.end() || !added->is_array()) return std::nullopt;
    for (const nlohmann::ordered_json& token : *added) {
      if (!token.is_object() || !token.contains("id") || !token.contains("content")) continue;
      const nlohmann::ordered_json& content = token["content"];
      if (content.is_string() && (content == kGpt2EndOfText || content == kLlama3EndOfText)) {
        return checked(content.get<std::string>(), token["id"], *file);
      }
    }
    return std::nullopt;
  }
  if (const HfExportFile* file = find_file(files, "vocab.json")) {
    const nlohmann::ordered_json json = parse_json(file->bytes, file->source);
    const auto found = json.find(std::string(kGpt2EndOfText));
    if (found != json.end()) return checked(std::string(kGpt2EndOfText), *found, *file);
  }
  return std::nullopt;
}

bool holds_id(const HfTokenId& token, int64_t id) {
  return std::find(token.ids.begin(), token.ids.end(), id) != token.ids.end();
}

// A tokenizer_config.json for a tokenizer that came without one, so that
// AutoTokenizer.from_pretrained reads its files: the class that reads them
// (a tokenizer.json whole; vocab.json with merges.txt as GPT-2's tokenizer),
// and the end-of-text token's text where its id is the export's eos or bos.
HfExportFile minimal_tokenizer_config(const std::vector<HfExportFile>& tokenizer, const HfTokenIds& token_ids,
                                      const std::optional<EndOfText>& end_of_text) {
  nlohmann::ordered_json json = {
      {"tokenizer_class", find_file(tokenizer, "tokenizer.json") ? "PreTrainedTokenizerFast" : "GPT2Tokenizer"}};
  if (end_of_text && holds_id(token_ids.bos, end_of_text->id)) json["bos_token"] = end_of_text->content;
  if (end_of_text && holds_id(token_ids.eos, end_of_text->id)) json["eos_token"] = end_of_text->content;
  return {kHfTokenizerConfigFile, json.dump(2) + "\n", kWrittenHere};
}

// generation_config.json, where transformers' generate reads the ids it
// stops at: the source directory's, carried with its own ids (checked), a key
// it leaves null filled from `token_ids` (as transformers fills a generation
// config from the model's); else, when an eos id is known, one of the ids.
std::optional<HfExportFile> generation_config_file(const std::string& model_dir, const HfTokenIds& token_ids,
                                                   int64_t vocab_size) {
  const fs::path path = fs::path(model_dir) / kHfGenerationConfigFile;
  std::error_code error;
  const bool carried = !model_dir.empty() && fs::exists(path, error);
  if (!carried && !token_ids.eos.known()) return std::nullopt;
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (carried) {
    json = parse_json(tessera::checkpoint::read_file_text(path.string()), path.string());
    hf_token_ids_from_json(nlohmann::json(json), vocab_size, path.string());
  }
  const std::pair<const char*, const HfTokenId*> keys[] = {
      {"bos_token_id", &token_ids.bos}, {"eos_token_id", &token_ids.eos}, {"pad_token_id", &token_ids.pad}};
  for (const auto& [key, token] : keys) {
    if (token->known() && (!json.contains(key) || json[key].is_null())) json[key] = token->to_json();
  }
  return HfExportFile{kHfGenerationConfigFile, json.dump(2) + "\n", carried ? path.string() : kWrittenHere};
}

}  // namespace

HfCompanions hf_companions(const ModelConfig& config, const HfExportSources& sources) {
  const int64_t vocab = vocab_size(config);
  HfCompanions companions;
  HfTokenIds& token_ids = companions.token_ids;
  if (!sources.model_dir.empty()) {
    const std::string path = (fs::path(sources.model_dir) / kHfConfigFile).string();
    token_ids = hf_token_ids_from_json(nlohmann::json(parse_json(tessera::checkpoint::read_file_text(path), path)),
                                       vocab, path);
  }
  std::vector<HfExportFile> tokenizer;
  if (!sources.tokenizer.empty()) tokenizer = read_tokenizer_files(sources.tokenizer);
  const std::optional<EndOfText> end_of_text = end_of_text_token(tokenizer, vocab);
  if (end_of_text) {
    // The source config's ids win; the tokenizer's end of text fills the ones
    // it leaves null (GPT-2's <|endoftext|> also begins a text).
    if (!token_ids.eos.known()) token_ids.eos.ids = {end_of_text->id};
    if (!token_ids.bos.known() && end_of_text->content == kGpt2EndOfText) token_ids.bos.ids = {end_of_text->id};
  }
  if (std::optional<HfExportFile> generation = generation_config_file(sources.model_dir, token_ids, vocab)) {
    companions.files.push_back(std::move(*generation));
  }
  const bool readable = find_file(tokenizer, "tokenizer.json") || find_file(tokenizer, "vocab.json");
  if (readable && !find_file(tokenizer, kHfTokenizerConfigFile)) {
    tokenizer.push_back(minimal_tokenizer_config(tokenizer, token_ids, end_of_text));
  }
  for (HfExportFile& file : tokenizer) companions.files.push_back(std::move(file));
  return companions;
}

std::vector<int64_t> hf_end_of_text_ids(const std::string& dir, int64_t vocab_size) {
  std::error_code error;
  for (const char* name : {kHfGenerationConfigFile, kHfConfigFile}) {
    const std::string path = (fs::path(dir) / name).string();
    if (!fs::exists(path, error)) continue;
    const nlohmann::json json = parse_json(tessera::checkpoint::read_file_text(path), path);
    const HfTokenId eos = hf_token_ids_from_json(json, vocab_size, path).eos;
    if (eos.known()) return eos.ids;
  }
  return {};
}

}  // namespace tessera::train
