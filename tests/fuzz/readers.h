// tests/fuzz/readers.h: one input through every reader of untrusted bytes: state.bin, the
// safetensors header and its tensors, the config text (then validate(), and a round trip; and
// with its first value stretched past kMaxConfigValue, which must be refused), the command line, a text's UTF-8 (the character vocabulary, then an encode / decode round
// trip), an llm.c token shard (written to a file beside a valid validation shard, loaded and
// batched), llm.c's tokenizer file (loaded, then decoding), --init-from's readers of llm.c's
// model file and of a Hugging Face model.safetensors (beside a fixed config.json), and the
// byte-level BPE readers (vocab.json NUL merges.txt, tokenizer.json, a tiktoken rank file; then
// an encode / decode round trip). The first
// byte picks the reader, the rest is its input. InputError is
// the answer to bad bytes; any other exception (thrown on), crash or sanitizer report is a
// finding. Shared by the libFuzzer target (fuzz_readers.cpp) and the CPU suite, which replays
// the seeds and every input kept in tests/fuzz/regressions/ (test_fuzz.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../model/formats/checkpoint.h"
#include "../../model/run/config.h"
#include "../../data/errors.h"
#include "../../model/net/gpt.h"
#include "../../model/formats/init_from.h"
#include "../../model/formats/safetensors.h"
#include "../../data/dataset.h"
#include "../../data/tokens.h"
#include "../../data/bpe.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

namespace fuzz {

enum Reader : uint8_t {
  kState = 0, kSafetensors = 1, kConfigText = 2, kArgs = 3, kText = 4, kShard = 5, kTokenizer = 6, kLlmcModel = 7, kHfModel = 8,
  kBpeVocab = 9, kBpeJson = 10, kTiktoken = 11, kReaders = 12
};

// A directory of this process for the readers that read files, removed at exit.
inline std::string scratch_dir() {
  static const struct Scratch {
    std::string path;
    Scratch() : path((std::filesystem::temp_directory_path() / ("tg_fuzz_" + std::to_string(getpid()))).string()) {
      std::filesystem::create_directories(path);
    }
    ~Scratch() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } dir;
  return dir.path;
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// An llm.c shard of the tokens: the 256-int32 header, then uint16 tokens.
inline std::string shard_bytes(const std::vector<uint16_t>& tokens) {
  std::string b(1024 + 2 * tokens.size(), '\0');
  const int32_t head[3] = {data::kShardMagic, 1, (int32_t)tokens.size()};
  std::memcpy(&b[0], head, sizeof head);
  if (!tokens.empty()) std::memcpy(&b[1024], tokens.data(), 2 * tokens.size());
  return b;
}

// The model the safetensors inputs are read against (its file is one of the seeds).
inline const std::vector<tg::ParamSpec>& table() {
  static const std::vector<tg::ParamSpec> t = tg::param_table(tg::ModelConfig{3, 2, 1, 1, 2, true});
  return t;
}

// The reader the first byte picks, on the rest. InputError, the answer to bad bytes, ends the
// read (and is thrown on when refusals is set).
inline void read_one(const uint8_t* data, size_t size, bool refusals = false) {
  if (size == 0) return;
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % kReaders) {
      case kState:
        tg::ckpt::parse_state_bytes(in, "fuzz/state.bin");
        break;
      case kSafetensors: {
        const tg::ckpt::StFile f = tg::ckpt::parse_safetensors(in, "fuzz/model.safetensors");
        tg::ckpt::check_finite(f, in, "fuzz/model.safetensors");
        tg::ckpt::model_numel(f);
        tg::ckpt::safetensors_tensors(f, in, "fuzz/model.safetensors", table());
        break;
      }
      case kConfigText: {
        // first, the text with its first line's value repeated past kMaxConfigValue: never read
        const size_t eq = in.find('='), end = std::min(in.find('\n'), in.size());
        if (eq < end && eq + 1 < end) {
          const std::string value = in.substr(eq + 1, end - eq - 1);
          std::string stretched;
          stretched.reserve(tg::kMaxConfigValue + 2 * value.size());
          while (stretched.size() <= tg::kMaxConfigValue) stretched += value;
          bool refused = false;
          try {
            tg::config_from_text(in.substr(0, eq + 1) + stretched + in.substr(end));
          } catch (const tg::InputError&) {
            refused = true;
          }
          if (!refused) throw std::logic_error("a config value longer than kMaxConfigValue was read");
        }
        const tg::Config c = tg::config_from_text(in);
        const std::string text = tg::config_to_text(c);
        if (tg::config_to_text(tg::config_from_text(text)) != text)
          throw std::logic_error("config text does not round trip");
        tg::validate(c);
        break;
      }
      case kArgs: {  // arguments separated by NUL bytes
        std::vector<std::string> args = {"train_gpt"};
        size_t at = 0;
        for (size_t nul; (nul = in.find('\0', at)) != std::string::npos; at = nul + 1) args.push_back(in.substr(at, nul - at));
        args.push_back(in.substr(at));
        std::vector<const char*> argv;
        for (const std::string& a : args) argv.push_back(a.c_str());
        tg::parse_args((int)argv.size(), argv.data(), "baby");
        break;
      }
      case kText: {
        const data::CharTokenizer tok = data::CharTokenizer::from_text(in);
        const std::vector<int32_t> ids = tok.encode(in);
        if (tok.decode(ids.data(), ids.size()) != in) throw std::logic_error("text does not round trip");
        if (data::CharTokenizer::from_chars(tok.chars()).chars() != tok.chars())
          throw std::logic_error("vocabulary does not round trip");
        break;
      }
      case kShard: {  // the input as the training shard, beside a valid validation shard
        const std::string dir = scratch_dir() + "/shards";
        std::filesystem::create_directories(dir);
        write_file(dir + "/f_train_000001.bin", in);
        write_file(dir + "/f_val_000000.bin", shard_bytes({1, 2, 3, 4, 5}));
        const auto td = data::load_token_data(dir, 2);
        int32_t x[4], y[4];
        for (uint32_t step = 0; step < 4; ++step) data::token_train_batch(td->train, 7, step, 2, 2, x, y);
        break;
      }
      case kLlmcModel: {
        const std::string dir = scratch_dir() + "/llmc";
        std::filesystem::create_directories(dir);
        write_file(dir + "/gpt2.bin", in);
        tg::read_init_source(dir + "/gpt2.bin");
        break;
      }
      case kHfModel: {  // the model of table(), GPT-2's config.json
        const std::string dir = scratch_dir() + "/hf";
        std::filesystem::create_directories(dir);
        write_file(dir + "/config.json", "{\"model_type\": \"gpt2\", \"n_layer\": 1, \"n_head\": 1, \"n_embd\": 2, "
                                         "\"vocab_size\": 3, \"n_positions\": 2}");
        write_file(dir + "/model.safetensors", in);
        tg::read_init_source(dir);
        break;
      }
      case kBpeVocab:  // vocab.json, a NUL byte, merges.txt
      case kBpeJson:
      case kTiktoken: {
        const size_t nul = in.find('\0');
        const data::BpeTokenizer t =
            data[0] % kReaders == kBpeVocab ? data::BpeTokenizer::from_vocab_merges(in.substr(0, nul), nul == std::string::npos ? "" : in.substr(nul + 1), "fuzz/vocab.json")
            : data[0] % kReaders == kBpeJson ? data::BpeTokenizer::from_tokenizer_json(in, "fuzz/tokenizer.json")
                                             : data::BpeTokenizer::from_tiktoken(in, "fuzz/x.tiktoken");
        for (const std::string& text : {std::string("Hello world, it's 12 o'clock \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x91\x8d\n\n  x"),
                                       std::string(300, 'a') + "  \t"}) {
          const std::vector<int32_t> ids = t.encode(text);
          if (t.decode(ids.data(), ids.size()) != text) throw std::logic_error("a BPE does not round trip");
        }
        break;
      }
      case kTokenizer: {
        const std::string path = scratch_dir() + "/gpt2_tokenizer.bin";
        write_file(path, in);
        const data::Gpt2Tokenizer t = data::Gpt2Tokenizer::load(path);
        std::vector<int32_t> ids;
        for (int32_t i = 0; i < (int32_t)t.tokens.size() && i < 16; ++i) ids.push_back(i);
        t.decode(ids.data(), ids.size());
        break;
      }
    }
  } catch (const tg::InputError&) {
    if (refusals) throw;
  }
}

// One input for each reader that reads (a valid state.bin, model.safetensors, config, command
// line): where the fuzzer starts.
inline std::vector<std::string> seeds() {
  tg::Config c;
  tg::apply_preset(c, "baby");
  c.n_layer = 1; c.n_head = 1; c.n_embd = 2; c.block_size = 2; c.bias = true; c.out_dir = "out/fuzz";
  const size_t n = tg::param_count(table());
  std::vector<float> params(n, 0.5f), m(n, 0.25f), v(n, 0.125f);
  tg::ckpt::CheckpointInfo info;
  info.step = 7;
  info.config = c;
  info.data_sha256 = std::string(64, 'f');
  info.data_path = "/data/input.txt";
  info.unlogged = {"{\"step\": 6, \"train_loss\": null}"};
  const std::string weights = tg::ckpt::safetensors_bytes(table(), params.data(), "n_layer=1", "\n\xce\xb1\xe6\x97\xa5");
  const std::string state =
      tg::ckpt::state_bytes(info, m.data(), v.data(), n, tg::ckpt::crc32(weights.data(), weights.size()));
  std::string args;
  for (const char* a : {"--lr", "3e-4", "--n-embd=64", "--resume", "--prompt", "ROMEO:"}) args += std::string(a) + '\0';
  args.pop_back();
  // llm.c's tokenizer file, version 2: 4 tokens, the last the end of text
  std::string tokenizer(1024, '\0');
  const uint32_t th[4] = {(uint32_t)data::kTokenizerMagic, 2, 4, 3};
  std::memcpy(&tokenizer[0], th, sizeof th);
  for (const std::string tkn : {"a", " b", "\xce\xb1", "<|endoftext|>"}) tokenizer += std::string(1, (char)tkn.size()) + tkn;
  // llm.c's model file of table()'s model, bf16 (version 5), V 3 padded to 4
  const std::vector<int32_t> lh = {20240326, 5, 2, 3, 1, 1, 2, 4};
  std::string llmc(1024, '\0');
  std::memcpy(&llmc[0], lh.data(), 4 * lh.size());
  llmc += std::string(2 * (n + 2), '\x3f');  // n + 2: wte's padding row
  // Hugging Face's file of the same model: GPT-2's names, Conv1D weights (in, out), a tied head
  std::vector<tg::ckpt::StPiece> pieces;
  for (const tg::ParamSpec& p : table()) {
    std::vector<int> shape = p.shape;
    if (shape.size() == 2 && p.name.find(".h.") != std::string::npos) std::swap(shape[0], shape[1]);
    pieces.push_back({p.name, shape, params.data() + p.offset, p.numel});
  }
  pieces.push_back({"lm_head.weight", table()[0].shape, params.data(), table()[0].numel});
  std::string hf;
  tg::ckpt::write_safetensors_pieces([&](const void* d, size_t k) { hf.append((const char*)d, k); }, pieces, {});
  // byte-level BPEs: every byte a token (GPT-2's alphabet), "a b" merged, the end of text last
  std::string vocab = "{", tiktoken;
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const unsigned cp = self ? (unsigned)b : 256u + (unsigned)extra++;
    std::string ch = cp < 0x80 ? std::string(1, (char)cp) : std::string{(char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F))};
    if (ch == "\"" || ch == "\\") ch = "\\" + ch;
    vocab += "\"" + ch + "\": " + std::to_string(b) + ", ";
    static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    tiktoken += std::string{b64[b >> 2], b64[(b & 3) << 4], '=', '='} + " " + std::to_string(b) + "\n";
  }
  vocab += "\"ab\": 256, \"\u0120a\": 257, \"<|endoftext|>\": 258}";
  tiktoken += "YWI= 256\nIGE= 257\n";
  const std::string merges = "#version: 0.2\na b\n\u0120 a\n";
  const std::string json = "{\"model\": {\"type\": \"BPE\", \"vocab\": " + vocab + ", \"merges\": [\"a b\", [\"\u0120\", \"a\"]]}, "
                           "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}, \"normalizer\": null, "
                           "\"added_tokens\": [{\"id\": 258, \"content\": \"<|endoftext|>\", \"special\": true}]}";
  return {std::string(1, (char)kState) + state, std::string(1, (char)kSafetensors) + weights,
          std::string(1, (char)kConfigText) + tg::config_to_text(c), std::string(1, (char)kArgs) + args,
          std::string(1, (char)kText) + "First Citizen:\n\xce\xb1\xce\xb2 caf\xc3\xa9 \xe6\x97\xa5",
          std::string(1, (char)kShard) + shard_bytes({50256, 15496, 11, 995, 0, 50256, 1, 2}),
          std::string(1, (char)kTokenizer) + tokenizer, std::string(1, (char)kLlmcModel) + llmc,
          std::string(1, (char)kHfModel) + hf, std::string(1, (char)kBpeVocab) + vocab + '\0' + merges,
          std::string(1, (char)kBpeJson) + json, std::string(1, (char)kTiktoken) + tiktoken};
}

// An input refused by one check of the readers, and what its message says: seeds that start
// the fuzzer next to those checks (AdamW moments and weights that are not finite, a negative
// second moment, a dtype none of safetensors'), replayed by the CPU suite, which checks that
// each is refused so.
struct Refused {
  std::string input, says;
};

inline std::vector<Refused> refused_seeds() {
  const std::vector<std::string> s = seeds();
  const std::string state = s[kState].substr(1), weights = s[kSafetensors].substr(1), hf = s[kHfModel].substr(1);
  const uint32_t weights_crc = tg::ckpt::crc32(weights.data(), weights.size());
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  // state.bin with its moments changed, written (CRCs and all) as train_gpt writes it
  auto state_with = [&](size_t i, bool v, float x) {
    tg::ckpt::Checkpoint k = tg::ckpt::parse_state_bytes(state, "seed");
    (v ? k.v : k.m)[i] = x;
    return std::string(1, (char)kState) + tg::ckpt::state_bytes(k, k.m.data(), k.v.data(), k.m.size(), weights_crc);
  };
  // a safetensors file with element i of tensor name set to x
  auto weight_at = [](Reader r, std::string bytes, const std::string& name, size_t i, float x) {
    const tg::ckpt::StFile f = tg::ckpt::parse_safetensors(bytes, "seed");
    for (const tg::ckpt::StTensor& t : f.tensors)
      if (t.name == name) std::memcpy(&bytes[f.data_start + t.begin + 4 * i], &x, 4);
    return std::string(1, (char)r) + bytes;
  };
  // a safetensors file with the dtype of lm_head.weight (which the readers skip or only compare)
  // replaced, the header as long (JSON spaces)
  auto dtype_of = [](Reader r, std::string bytes, const std::string& dtype) {
    const std::string key = "\"lm_head.weight\":{\"dtype\":\"F32\"";
    const size_t at = bytes.find(key);
    if (at != std::string::npos)
      bytes.replace(at, key.size(), "\"lm_head.weight\":{\"dtype\":\"" + dtype + "\"" + std::string(3 - dtype.size(), ' '));
    return std::string(1, (char)r) + bytes;
  };
  std::string llmc = s[kLlmcModel];
  llmc[1 + 1024 + 2] = '\xc0';  // wte's element 1, a bf16 NaN (0x7fc0)
  llmc[1 + 1024 + 3] = '\x7f';
  return {
      {state_with(1, false, nan), "holds AdamW first moment m[1] = nan"},
      {state_with(0, true, -1.0f), "holds AdamW second moment v[0] = -1"},
      {state_with(2, true, inf), "holds AdamW second moment v[2] = inf"},
      {weight_at(kSafetensors, weights, "transformer.wpe.weight", 1, nan),
       "holds a weight that is not finite: transformer.wpe.weight[1] = nan"},
      {weight_at(kHfModel, hf, "transformer.wpe.weight", 3, -inf),
       "holds a weight that is not finite: transformer.wpe.weight[3] = -inf"},
      {llmc, "holds a weight that is not finite: transformer.wte.weight[1] = nan"},
      {dtype_of(kSafetensors, weights, ""), "has a bad header entry \"lm_head.weight\": dtype \"\" is none of the format's"},
      {dtype_of(kHfModel, hf, "F33"), "has a bad header entry \"lm_head.weight\": dtype \"F33\" is none of the format's"},
  };
}

}  // namespace fuzz
