// tests/cpu/test_fuzz.cpp: the readers of untrusted bytes under fuzzing (tests/fuzz/readers.h).
//   - the seeds, damaged variants of them and every input kept in tests/fuzz/regressions/ go
//     through the readers here, in every build (the sanitizer build included); the seeds made
//     to be refused by one check each are refused with its message;
//   - the libFuzzer target (path in TG_FUZZ, built by make when clang++ has libFuzzer) runs
//     from the seeds for TG_FUZZ_SECONDS (default 5) and must find nothing; skipped, and
//     counted as skipped, without it.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../fuzz/readers.h"

namespace fs = std::filesystem;

namespace {

const char* fuzzer() {
  const char* f = std::getenv("TG_FUZZ");
  return f && *f && fs::exists(f) ? f : nullptr;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void read(const std::string& input, bool refusals = false) {
  fuzz::read_one(reinterpret_cast<const uint8_t*>(input.data()), input.size(), refusals);
}

// Every seed: those read back, then those refused by one check each.
std::vector<std::string> all_seeds() {
  std::vector<std::string> all = fuzz::seeds();
  for (const fuzz::Refused& r : fuzz::refused_seeds()) all.push_back(r.input);
  return all;
}

}  // namespace

TEST_CASE("fuzz: the seeds read back; their damaged variants and the inputs kept as regressions are refused cleanly") {
  for (const std::string& seed : all_seeds()) {
    CAPTURE(seed.size());
    CHECK_NOTHROW(read(seed));
    // every prefix, and each byte flipped in turn: InputError or a clean read, nothing else
    for (size_t n = 0; n < seed.size(); n += 7) CHECK_NOTHROW(read(seed.substr(0, n)));
    for (size_t i = 1; i < seed.size(); i += 5) {
      std::string bad = seed;
      bad[i] ^= 0x55;
      CHECK_NOTHROW(read(bad));
    }
  }
  // the seeds are valid inputs, not refused ones: state.bin parses, the tensors extract
  const std::vector<std::string> s = fuzz::seeds();
  CHECK(tg::ckpt::parse_state_bytes(s[fuzz::kState].substr(1), "seed").step == 7);
  const std::string w = s[fuzz::kSafetensors].substr(1);
  CHECK(tg::ckpt::safetensors_tensors(tg::ckpt::parse_safetensors(w, "seed"), w, "seed", fuzz::table()).size() ==
        tg::param_count(fuzz::table()));
  // --init-from's: llm.c's and Hugging Face's files of the same model read back whole
  for (const auto& [k, file] : {std::pair<int, std::string>{fuzz::kLlmcModel, "/llmc/gpt2.bin"}, {fuzz::kHfModel, "/hf"}}) {
    CHECK_NOTHROW(read(s[k]));  // writes the file (and the config.json beside)
    CHECK(tg::read_init_source(fuzz::scratch_dir() + file).params.size() == tg::param_count(fuzz::table()));
  }
  // what the fuzzer once found
  for (const auto& e : fs::directory_iterator("tests/fuzz/regressions")) {
    if (e.path().filename() == "README") continue;
    CAPTURE(e.path().string());
    CHECK_NOTHROW(read(bytes_of(e.path())));
  }
}

TEST_CASE("fuzz: each refused seed reaches its check: an InputError saying what it found") {
  for (const fuzz::Refused& r : fuzz::refused_seeds()) {
    CAPTURE(r.says);
    CHECK_THROWS_WITH_AS(read(r.input, true), doctest::Contains(r.says.c_str()), tg::InputError);
  }
}

TEST_CASE("fuzz: libFuzzer over the readers finds nothing in a bounded run" * doctest::skip(fuzzer() == nullptr)) {
  const fs::path corpus = fs::temp_directory_path() / ("tg_fuzz_corpus_" + std::to_string(getpid()));
  fs::remove_all(corpus);
  fs::create_directories(corpus);
  int k = 0;
  for (const std::string& seed : all_seeds())
    std::ofstream((corpus / ("seed" + std::to_string(k++))).string(), std::ios::binary) << seed;
  const char* secs = std::getenv("TG_FUZZ_SECONDS");
  const fs::path artifacts = corpus / "crash-";
  const std::string cmd = std::string(fuzzer()) + " -max_total_time=" + (secs ? secs : "5") +
                          " -max_len=8192 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=" +
                          artifacts.string() + " " + corpus.string() + " >" + (corpus / "log").string() + " 2>&1";
  const int status = std::system(cmd.c_str());
  const std::string log = bytes_of(corpus / "log");
  const size_t runs = log.find("stat::number_of_executed_units:");
  if (status != 0 || runs == std::string::npos) {  // the input that found it is kept under corpus
    FAIL_CHECK("libFuzzer found something (its input: " << artifacts.string() << "*); keep it in "
               "tests/fuzz/regressions/ once fixed; its last lines: " << log.substr(log.size() > 3000 ? log.size() - 3000 : 0));
    return;
  }
  MESSAGE(log.substr(runs, log.find('\n', runs) - runs));
  fs::remove_all(corpus);
}
