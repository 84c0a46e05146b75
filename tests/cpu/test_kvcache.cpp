// tests/cpu/test_kvcache.cpp: incremental decoding with a KV cache (GPTCpu::decode_step, the
// backend's generate_step) against full forwards, nanoGPT's cropping past block_size, and
// sample() (reproducible, greedy with top_k = 1 or a tiny top_p, top-k + top-p against a
// reference sampler). The last case times 500 generated tokens, cached vs full forwards.
//
// Tolerances: decode_step and forward() run the same ops in a different order (one-row
// matrix-vector products, another attention loop), so they differ by rounding only: the
// worst |a - b| over the V logits, relative to the largest |b|, stays near 1e-15 in double
// and 1e-7 in float; the bounds 1e-12 and 1e-5 leave a margin of 1000x and 100x, while a
// wrong term (a position, a cached row, a scale) changes the logits at order 1e-2 or more.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../../data/dataset.h"
#include "../../kernels/philox.h"
#include "../../model/net/backend.h"
#include "../../model/run/config.h"
#include "../../model/net/gpt.h"
#include "../../model/net/gpt_cpu.h"
#include "../../model/run/train.h"
#include "test_util.h"

using namespace tg;

namespace {

// V = 11, block 8, 2 layers, 2 heads, C = 8
ModelConfig small_model(bool bias) { return ModelConfig{11, 8, 2, 2, 8, bias}; }

RunShape shape(int B, int T) {
  RunShape r;
  r.B = B;
  r.T = T;
  return r;
}

// init_params plus uniform noise in [-0.1, 0.1] (layernorms and biases off 1 and 0).
std::vector<double> random_params(const ModelConfig& m, uint64_t seed) {
  std::vector<ParamSpec> t = param_table(m);
  std::vector<float> w(param_count(t));
  init_params(w.data(), t, seed);
  auto noise = testutil::random_vec<double>(w.size(), -0.1, 0.1);
  std::vector<double> p(w.size());
  for (size_t i = 0; i < w.size(); ++i) p[i] = w[i] + noise[i];
  return p;
}

template <typename T>
void set_params(GPTCpu<T>& g, const std::vector<double>& p) {
  for (size_t i = 0; i < p.size(); ++i) g.params[i] = (T)p[i];
}

// max |a - b| / max |b| over n values
template <typename T>
double rel_diff(const T* a, const T* b, int n) {
  double d = 0, s = 0;
  for (int i = 0; i < n; ++i) {
    d = std::max(d, std::abs((double)a[i] - (double)b[i]));
    s = std::max(s, std::abs((double)b[i]));
  }
  return d / s;
}

// Logits (V) of the last position of a full forward over the last block_size tokens of seq
// (nanoGPT's cropping), on a model whose run shape has T = block_size.
template <typename T>
std::vector<T> full_last_logits(GPTCpu<T>& ref, const std::vector<int32_t>& seq) {
  const int maxT = ref.model().block_size, V = ref.model().vocab_size;
  const int len = std::min((int)seq.size(), maxT);
  ref.forward(seq.data() + seq.size() - len, nullptr, 1, len, false, 0);
  const T* l = ref.logits() + (size_t)(len - 1) * V;
  return std::vector<T>(l, l + V);
}

template <typename T>
int argmax(const T* l, int n) {
  return (int)(std::max_element(l, l + n) - l);
}

// Steps seq through dec from a reset and compares every position's logits with a full forward
// of ref over the (cropped) prefix. Returns the worst relative difference.
template <typename T>
double decode_vs_forward(GPTCpu<T>& dec, GPTCpu<T>& ref, const std::vector<int32_t>& seq) {
  const int V = dec.model().vocab_size;
  dec.decode_reset();
  double worst = 0;
  for (size_t n = 0; n < seq.size(); ++n) {
    const T* l = dec.decode_step(seq[n]);
    std::vector<T> got(l, l + V);  // copied before ref runs (ref may be dec itself)
    std::vector<int32_t> prefix(seq.begin(), seq.begin() + n + 1);
    std::vector<T> want = full_last_logits(ref, prefix);
    worst = std::max(worst, rel_diff(got.data(), want.data(), V));
  }
  return worst;
}

// The text, tokenizer and model of the sample() tests: 11 characters, the small model.
struct SampleSetup {
  data::CharTokenizer tok = data::CharTokenizer::from_text("abcdefghij\n");
  Config c;
  ModelConfig m;
  std::unique_ptr<Backend> be;
  SampleSetup() {
    apply_preset(c, "baby");
    c.n_layer = 2; c.n_head = 2; c.n_embd = 8; c.block_size = 8; c.batch_size = 2;
    c.prompt = "ab\nc";
    c.sample_tokens = 30;  // past block_size: the cropping is exercised too
    m = small_model(false);
    m.vocab_size = tok.vocab_size();
    be = make_cpu_backend(m, run_shape(c));
    // (the init + fixed noise) x 5: logits well apart, so no argmax is a near tie, and the
    // same weights every run (the greedy checks below REQUIRE a gap)
    std::vector<ParamSpec> t = param_table(m);
    std::vector<float> pf(param_count(t)), zeros(pf.size(), 0.0f);
    init_params(pf.data(), t, c.seed);
    std::mt19937_64 gen(7);
    std::uniform_real_distribution<double> u(-0.1, 0.1);
    for (float& w : pf) w = (float)((w + u(gen)) * 5);
    be->set_state(pf.data(), zeros.data(), zeros.data());
  }
  std::string run(const Config& cc) {
    std::ostringstream os;
    std::string text = sample(*be, cc, tok, os);
    CHECK(os.str() == text + "\n");  // streamed as it came
    return text;
  }
  // A float GPTCpu with the backend's parameters, for full forwards.
  std::unique_ptr<GPTCpu<float>> reference() {
    auto g = std::make_unique<GPTCpu<float>>(m, shape(1, m.block_size));
    std::vector<float> p = be->params();
    std::copy(p.begin(), p.end(), g->params.begin());
    return g;
  }
};

// nanoGPT's sampling, written out independently of sample(): softmax(logits / temperature),
// keep the top_k most likely, then the most likely whose probability first reaches top_p of
// what is left, draw with u = uniform of the sampling stream at the token's position.
int reference_draw(const std::vector<float>& logits, const Config& c, uint32_t position) {
  const int V = (int)logits.size();
  std::vector<std::pair<double, int>> p;
  double mx = *std::max_element(logits.begin(), logits.end()) / c.temperature;
  for (int v = 0; v < V; ++v) p.push_back({std::exp(logits[v] / c.temperature - mx), v});
  std::sort(p.begin(), p.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  if (c.top_k > 0 && c.top_k < V) p.resize(c.top_k);
  double total = 0;
  for (auto& e : p) total += e.first;
  size_t keep = 0;
  double cum = 0;
  while (keep < p.size() && (keep == 0 || cum < c.top_p * total)) cum += p[keep++].first;
  p.resize(keep);
  philox::U32x4 w = philox::stream_words(c.seed, philox::kStreamSample, position, 0, 0);
  double u = (w.v[0] + 0.5) / 4294967296.0 * cum, acc = 0;
  for (auto& e : p) {
    acc += e.first;
    if (u < acc) return e.second;
  }
  return p.back().second;
}

}  // namespace

TEST_CASE("kvcache: decode_step logits equal a full forward of each prefix (double 1e-12, float 1e-5)") {
  for (bool bias : {false, true}) {
    CAPTURE(bias);
    ModelConfig m = small_model(bias);
    std::vector<double> p = random_params(m, 1234);
    std::vector<int32_t> seq = testutil::random_tokens(m.block_size, m.vocab_size);  // every position
    for (bool flash : {true, false}) {  // the reference forward's attention path
      CAPTURE(flash);
      RunShape r = shape(2, m.block_size);
      r.attention = flash ? AttentionPath::Flash : AttentionPath::Naive;
      r.Br = r.Bc = 3;  // several tiles
      GPTCpu<double> dd(m, r), rd(m, r);
      GPTCpu<float> df(m, r), rf(m, r);
      set_params(dd, p); set_params(rd, p); set_params(df, p); set_params(rf, p);
      double ed = decode_vs_forward(dd, rd, seq), ef = decode_vs_forward(df, rf, seq);
      std::printf("[kvcache] bias %d, %s reference: worst relative logit difference double %.2e, float %.2e\n", bias,
                  flash ? "flash" : "naive", ed, ef);
      CHECK(ed <= 1e-12);
      CHECK(ef <= 1e-5);
      // the cache is reusable: a reset starts a new sequence at position 0
      std::vector<int32_t> other = testutil::random_tokens(5, m.vocab_size);
      CHECK(decode_vs_forward(dd, rd, other) <= 1e-12);
      CHECK(dd.decode_pos() == 5);
    }
  }
}

TEST_CASE("kvcache: past block_size the window is cropped to the last block_size tokens, as nanoGPT") {
  for (bool bias : {false, true}) {
    CAPTURE(bias);
    ModelConfig m = small_model(bias);
    std::vector<double> p = random_params(m, 99);
    std::vector<int32_t> seq = testutil::random_tokens(3 * m.block_size + 3, m.vocab_size);
    // T >= block_size re-primes with one forward; T < block_size replays the window row by row
    for (int T : {m.block_size, m.block_size - 1, 1}) {
      CAPTURE(T);
      GPTCpu<double> dd(m, shape(1, T)), rd(m, shape(1, m.block_size));
      GPTCpu<float> df(m, shape(1, T)), rf(m, shape(1, m.block_size));
      set_params(dd, p); set_params(rd, p); set_params(df, p); set_params(rf, p);
      CHECK(decode_vs_forward(dd, rd, seq) <= 1e-12);
      CHECK(decode_vs_forward(df, rf, seq) <= 1e-5);
      CHECK(dd.decode_pos() == m.block_size);
    }
    // the decoder and the reference may be one object: re-priming overwrites its activations
    GPTCpu<double> one(m, shape(1, m.block_size));
    set_params(one, p);
    CHECK(decode_vs_forward(one, one, seq) <= 1e-12);
  }
}

TEST_CASE("kvcache: decode is deterministic (bitwise, after a reset and on a new object)") {
  ModelConfig m = small_model(true);
  std::vector<double> p = random_params(m, 5);
  std::vector<int32_t> seq = testutil::random_tokens(2 * m.block_size + 5, m.vocab_size);
  const int V = m.vocab_size;
  auto run = [&](GPTCpu<float>& g) {
    std::vector<float> all;
    g.decode_reset();
    for (int32_t t : seq) {
      const float* l = g.decode_step(t);
      all.insert(all.end(), l, l + V);
    }
    return all;
  };
  GPTCpu<float> a(m, shape(1, m.block_size)), b(m, shape(1, m.block_size));
  set_params(a, p); set_params(b, p);
  std::vector<float> first = run(a), again = run(a), fresh = run(b);
  REQUIRE(first.size() == seq.size() * V);
  CHECK(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(first.data(), fresh.data(), first.size() * sizeof(float)) == 0);
}

TEST_CASE("kvcache: the CPU backend's generate_step equals full forwards, cropping included") {
  SampleSetup s;
  auto ref = s.reference();
  const int V = s.m.vocab_size;
  std::vector<int32_t> seq = testutil::random_tokens(2 * s.m.block_size + 3, V);
  std::vector<float> got(V);
  double worst = 0;
  for (int rep = 0; rep < 2; ++rep) {  // generate_reset starts over
    s.be->generate_reset();
    for (size_t n = 0; n < seq.size(); ++n) {
      s.be->generate_step(seq[n], got.data());
      std::vector<float> want = full_last_logits(*ref, std::vector<int32_t>(seq.begin(), seq.begin() + n + 1));
      worst = std::max(worst, rel_diff(got.data(), want.data(), V));
    }
  }
  // float on both sides, summed in other orders (one cached row against a full (T, C) pass),
  // through weights scaled by 5 (well-separated logits, so large activations): up to 1.4e-5
  // of the largest logit over 40 input seeds. A cache bug (a stale or misplaced key, a wrong
  // position) moves logits by O(1).
  CHECK(worst <= 1e-4);
}

TEST_CASE("kvcache: past block_size + 1 tokens, the earlier ones leave the logits' bits unchanged; a long prompt samples as the reference") {
  // sample() feeds only a prompt's last block_size + 1 tokens (model/run/train.cpp): once the
  // window is full each step recomputes it from its own tokens, whatever came before
  SampleSetup s;
  const int V = s.m.vocab_size, bs = s.m.block_size;
  const std::vector<int32_t> seq = testutil::random_tokens(5 * bs + 3, V);
  std::vector<float> all(V), tail(V);
  s.be->generate_reset();
  for (int32_t t : seq) s.be->generate_step(t, all.data());
  s.be->generate_reset();
  for (size_t i = seq.size() - bs - 1; i < seq.size(); ++i) s.be->generate_step(seq[i], tail.data());
  CHECK(std::memcmp(all.data(), tail.data(), V * sizeof(float)) == 0);
  // sample() from a prompt of 5 windows: the reference sampler over full forwards of the cropped context
  auto ref = s.reference();
  Config c = s.c;
  c.prompt = s.tok.decode(seq.data(), seq.size());
  std::vector<int32_t> idx = seq;
  for (int n = 0; n < c.sample_tokens; ++n)
    idx.push_back(reference_draw(full_last_logits(*ref, idx), c, (uint32_t)idx.size()));
  CHECK(s.run(c) == s.tok.decode(idx.data(), idx.size()));
}

TEST_CASE("kvcache: sample() is reproducible; top_k = 1 and top_p = 1e-9 give the argmax sequence") {
  SampleSetup s;
  Config c = s.c;
  c.temperature = 1.0;
  c.top_k = 0;
  const std::string a = s.run(c), b = s.run(c);
  CHECK(a == b);
  CHECK(a.size() == c.prompt.size() + (size_t)c.sample_tokens);
  CHECK(a.compare(0, c.prompt.size(), c.prompt) == 0);
  Config c2 = c;
  c2.seed = c.seed + 1;
  CHECK(s.run(c2) != a);  // the seed matters (30 draws from 11 characters)

  // greedy by hand: argmax of full forwards over the cropped context
  auto ref = s.reference();
  std::vector<int32_t> idx = s.tok.encode(c.prompt);
  double min_gap = INFINITY;
  for (int n = 0; n < c.sample_tokens; ++n) {
    std::vector<float> l = full_last_logits(*ref, idx);
    std::vector<float> sorted = l;
    std::sort(sorted.rbegin(), sorted.rend());
    min_gap = std::min(min_gap, (double)(sorted[0] - sorted[1]));
    idx.push_back(argmax(l.data(), (int)l.size()));
  }
  const std::string greedy = s.tok.decode(idx.data(), idx.size());
  REQUIRE(min_gap > 1e-4);  // no near-tie that float rounding could flip
  c.top_k = 1;
  CHECK(s.run(c) == greedy);
  c.top_k = 0;
  c.top_p = 1e-9;
  c.temperature = 0.8;
  CHECK(s.run(c) == greedy);
  c.top_k = 5;
  CHECK(s.run(c) == greedy);
}

TEST_CASE("kvcache: sample() with temperature, top-k and top-p equals a reference sampler over full forwards") {
  SampleSetup s;
  auto ref = s.reference();
  struct Case { double temperature; int top_k; double top_p; };
  for (Case k : {Case{1.0, 0, 1.0}, Case{0.8, 4, 1.0}, Case{1.3, 0, 0.5}, Case{1.0, 6, 0.7}, Case{2.0, 0, 0.9}}) {
    CAPTURE(k.temperature); CAPTURE(k.top_k); CAPTURE(k.top_p);
    Config c = s.c;
    c.temperature = k.temperature;
    c.top_k = k.top_k;
    c.top_p = k.top_p;
    std::vector<int32_t> idx = s.tok.encode(c.prompt);
    for (int n = 0; n < c.sample_tokens; ++n)
      idx.push_back(reference_draw(full_last_logits(*ref, idx), c, (uint32_t)idx.size()));
    CHECK(s.run(c) == s.tok.decode(idx.data(), idx.size()));
  }
}

TEST_CASE("kvcache: 500 tokens of the baby model, cached vs full forwards (timing reported, not asserted)") {
  ModelConfig m;
  m.vocab_size = 65; m.block_size = 64; m.n_layer = 4; m.n_head = 4; m.n_embd = 128;
  RunShape r = shape(1, m.block_size);
  GPTCpu<float> g(m, r);
  {  // the init plus fixed noise (the same every run): logits apart enough for a stable argmax
    std::vector<float> w(g.params.size());
    init_params(w.data(), g.table, 1337);
    std::mt19937_64 gen(42);
    std::uniform_real_distribution<double> u(-0.1, 0.1);
    for (size_t i = 0; i < w.size(); ++i) g.params[i] = (float)(w[i] + u(gen));
  }
  const int n_new = 500, V = m.vocab_size;
  using Clock = std::chrono::steady_clock;
  auto secs = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  // greedy from one token; times to the end of the first window and to 500 tokens
  std::vector<int32_t> cached{0}, full{0};
  double cached_window_s = 0, full_window_s = 0;
  auto t0 = Clock::now();
  g.decode_reset();
  const float* l = g.decode_step(cached[0]);
  for (int n = 0; n < n_new; ++n) {
    cached.push_back(argmax(l, V));
    if ((int)cached.size() == m.block_size) cached_window_s = secs(t0);
    if (n + 1 < n_new) l = g.decode_step(cached.back());
  }
  const double cached_s = secs(t0);
  t0 = Clock::now();
  for (int n = 0; n < n_new; ++n) {
    std::vector<float> fl = full_last_logits(g, full);
    full.push_back(argmax(fl.data(), V));
    if ((int)full.size() == m.block_size) full_window_s = secs(t0);
  }
  const double full_s = secs(t0);
  std::printf("[kvcache] baby model (4 layers, 4 heads, 128 wide, block 64, V 65), %d new tokens, greedy:\n"
              "[kvcache]   first %d tokens (within one window): cached %.1f ms, full forwards %.1f ms (%.1fx)\n"
              "[kvcache]   all %d tokens (cropping past 64):   cached %.1f ms, full forwards %.1f ms (%.1fx)\n",
              n_new, m.block_size - 1, cached_window_s * 1e3, full_window_s * 1e3, full_window_s / cached_window_s,
              n_new, cached_s * 1e3, full_s * 1e3, full_s / cached_s);
  CHECK(cached == full);  // the two ways generate the same text
}
