// tests/bench/bench_bpe.cpp: GPT-2's byte-level BPE encoder (data/bpe.h), MB/s, on tiny
// Shakespeare and on 100 MB of text (tiny Shakespeare and the hostile corpus of
// tests/interop/bpe/hostile.txt, in turn, to 100 MB: the text tests/interop/tokenizer_check.py
// --bench gives tiktoken), on one thread and on every core. make bench runs it beside tiktoken.
//   build/bench_bpe --data input.txt [--tokenizer DIR|FILE] [--mb 100]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "data/bpe.h"
#include "data/errors.h"

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The best wall time of reps runs of f, and the process's CPU time of that run in cpu (on a
// shared machine the CPU time of a one-thread run is the steadier figure).
template <typename F>
double best_seconds(int reps, F&& f, double* cpu = nullptr) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s < best && cpu) *cpu = (double)(std::clock() - c0) / CLOCKS_PER_SEC;
    best = std::min(best, s);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = "data/tinyshakespeare/input.txt", tok_path = "tests/interop/bpe/shakes8k/shakes8k.tiktoken";
  double mb = 100;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--data")) data = argv[i + 1];
    else if (!std::strcmp(argv[i], "--tokenizer")) tok_path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--mb")) mb = std::atof(argv[i + 1]);
  }
  try {
    const data::BpeTokenizer tok = data::BpeTokenizer::load(tok_path);
    const std::string shakes = slurp(data), hostile = slurp("tests/interop/bpe/hostile.txt");
    if (shakes.empty() || hostile.empty()) {
      std::fprintf(stderr, "bench_bpe: %s or tests/interop/bpe/hostile.txt is missing (run from the repository root)\n", data.c_str());
      return 2;
    }
    std::string big;
    while ((double)big.size() < mb * 1e6) big += shakes + hostile;
    std::printf("bench_bpe: %s (%d tokens, %s ranks), %d threads\n", tok_path.c_str(), tok.vocab_size(),
                tok.ranks() == data::BpeTokenizer::Ranks::Tiktoken ? "tiktoken" : "merges", omp_get_max_threads());
    size_t n = 0;
    double c1 = 0, c2 = 0;
    const double s1 = best_seconds(5, [&] { n = tok.encode(shakes).size(); }, &c1);
    std::printf("  tiny Shakespeare (%.2f MB, %zu ids), one thread:  %7.1f MB/s (of CPU time: %.1f MB/s)\n", shakes.size() / 1e6,
                n, shakes.size() / 1e6 / s1, shakes.size() / 1e6 / c1);
    const double s2 = best_seconds(1, [&] { n = tok.encode(big).size(); }, &c2);
    std::printf("  %.0f MB of text (%zu ids), one thread:              %7.1f MB/s (of CPU time: %.1f MB/s)\n", big.size() / 1e6, n,
                big.size() / 1e6 / s2, big.size() / 1e6 / c2);
    const double s3 = best_seconds(1, [&] { n = tok.encode_parallel(big.data(), big.size()).size(); });
    std::printf("  %.0f MB of text (%zu ids), every core:              %7.1f MB/s\n", big.size() / 1e6, n, big.size() / 1e6 / s3);
    const std::string one(1 << 20, 'a');
    const double s4 = best_seconds(3, [&] { n = tok.encode(one).size(); });
    std::printf("  a megabyte of one letter (one piece, %zu ids):     %7.3f s\n", n, s4);
  } catch (const tg::InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
