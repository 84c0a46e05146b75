// tests/fuzz/readers.h: one input through every reader of untrusted bytes: state.bin, the
// safetensors header and its tensors, the config text (then validate(), and a round trip),
// the command line. The first byte picks the reader, the rest is its input. InputError is
// the answer to bad bytes; any other exception (thrown on), crash or sanitizer report is a
// finding. Shared by the libFuzzer target (fuzz_readers.cpp) and the CPU suite, which replays
// the seeds and every input kept in tests/fuzz/regressions/ (test_fuzz.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../model/checkpoint.h"
#include "../../model/config.h"
#include "../../model/errors.h"
#include "../../model/gpt.h"
#include "../../model/safetensors.h"

namespace fuzz {

enum Reader : uint8_t { kState = 0, kSafetensors = 1, kConfigText = 2, kArgs = 3, kReaders = 4 };

// The model the safetensors inputs are read against (its file is one of the seeds).
inline const std::vector<tg::ParamSpec>& table() {
  static const std::vector<tg::ParamSpec> t = tg::param_table(tg::ModelConfig{3, 2, 1, 1, 2, true});
  return t;
}

inline void read_one(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % kReaders) {
      case kState:
        tg::ckpt::parse_state_bytes(in, "fuzz/state.bin");
        break;
      case kSafetensors: {
        const tg::ckpt::StFile f = tg::ckpt::parse_safetensors(in, "fuzz/model.safetensors");
        tg::ckpt::model_numel(f);
        tg::ckpt::safetensors_tensors(f, in, "fuzz/model.safetensors", table());
        break;
      }
      case kConfigText: {
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
    }
  } catch (const tg::InputError&) {
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
  return {std::string(1, (char)kState) + state, std::string(1, (char)kSafetensors) + weights,
          std::string(1, (char)kConfigText) + tg::config_to_text(c), std::string(1, (char)kArgs) + args};
}

}  // namespace fuzz
