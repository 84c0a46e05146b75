// tests/cpu/test_tokens.cpp: token data (llm.c shards, nanoGPT .bin), its batches and checks,
// llm.c's tokenizer file, and training on token data through the binary. Every file is
// synthetic, written here.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../../data/dataset.h"
#include "../../data/tokens.h"
#include "../../data/errors.h"
#include "../common/cli_util.h"

namespace fs = std::filesystem;

namespace {

void put32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s += (char)((v >> (8 * i)) & 0xff);
}

std::vector<uint16_t> some_tokens(size_t n, uint32_t salt, int V = data::kGpt2Vocab) {
  std::mt19937 g(salt);
  std::vector<uint16_t> t(n);
  for (auto& x : t) x = (uint16_t)(g() % V);
  return t;
}

std::string shard_bytes(const std::vector<uint16_t>& t, int32_t magic = data::kShardMagic, int32_t version = 1,
                        int64_t count = -1) {
  std::string s;
  put32(s, (uint32_t)magic);
  put32(s, (uint32_t)version);
  put32(s, (uint32_t)(count < 0 ? (int64_t)t.size() : count));
  s.resize(1024, '\0');
  for (uint16_t x : t) {
    s += (char)(x & 0xff);
    s += (char)(x >> 8);
  }
  return s;
}

std::string raw_bytes(const std::vector<uint16_t>& t) { return shard_bytes(t).substr(1024); }

void write(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string error_of(const std::string& spec, int T = 8) {
  try {
    data::load_token_data(spec, T);
  } catch (const tg::InputError& e) {
    return e.what();
  }
  return "";
}

struct Shards {
  fs::path dir;
  std::vector<uint16_t> t0, t1, v0;
  explicit Shards(const std::string& name) : dir(cli::fresh_dir(name)) {
    t0 = some_tokens(300, 1);
    t1 = some_tokens(200, 2);
    v0 = some_tokens(100, 3);
    write(dir / "fineweb_train_000001.bin", shard_bytes(t0));
    write(dir / "fineweb_train_000002.bin", shard_bytes(t1));
    write(dir / "fineweb_val_000000.bin", shard_bytes(v0));
  }
  ~Shards() { fs::remove_all(dir); }
};

}  // namespace

TEST_CASE("tokens: llm.c shards by directory, glob or file; split by name; read across shards; batches as the text sampler's") {
  Shards s("tg_tokens_shards");
  CHECK(data::is_token_data(s.dir.string()));
  CHECK(data::is_token_data((s.dir / "*.bin").string()));
  CHECK(!data::is_token_data("data/tinyshakespeare/input.txt"));
  for (const std::string& spec : {s.dir.string(), (s.dir / "fineweb_*.bin").string()}) {
    INFO(spec);
    auto d = data::load_token_data(spec, 8);
    CHECK(d->format == "llm.c shards");
    REQUIRE(d->train.size() == 500);
    REQUIRE(d->val.size() == 100);
    std::vector<int32_t> all(500);
    d->train.read(0, 500, all.data());
    for (size_t i = 0; i < 300; ++i) REQUIRE(all[i] == s.t0[i]);
    for (size_t i = 0; i < 200; ++i) REQUIRE(all[300 + i] == s.t1[i]);
    std::vector<int32_t> across(10);
    d->train.read(295, 10, across.data());  // the boundary of the two shards
    CHECK(std::equal(across.begin(), across.end(), all.begin() + 295));
    // a batch is the text sampler's batch over the same tokens, bitwise (micro-batch rows too)
    const int B = 4, T = 8;
    std::vector<int32_t> x(B * T), y(B * T), xr(B * T), yr(B * T);
    for (uint32_t row0 : {0u, 4u}) {
      data::token_train_batch(d->train, 7, 3, B, T, x.data(), y.data(), row0);
      data::train_batch(all, 7, 3, B, T, xr.data(), yr.data(), row0);
      CHECK(x == xr);
      CHECK(y == yr);
    }
    std::vector<int32_t> vall(100);
    d->val.read(0, 100, vall.data());
    data::token_eval_batch(d->val, 7, 1, 2, B, T, x.data(), y.data());
    data::eval_batch(vall, 7, 1, 2, B, T, xr.data(), yr.data());
    CHECK(x == xr);
  }
  // one shard named: its partner of the other split is found beside it by name (llm.c's
  // tinyshakespeare_train.bin / tinyshakespeare_val.bin); without one, the split is missing
  write(s.dir / "pair" / "tiny_train.bin", shard_bytes(s.t0));
  write(s.dir / "pair" / "tiny_val.bin", shard_bytes(s.v0));
  for (const char* name : {"tiny_train.bin", "tiny_val.bin"}) {
    auto one = data::load_token_data((s.dir / "pair" / name).string(), 8);
    CHECK(one->train.size() == 300);
    CHECK(one->val.size() == 100);
  }
  CHECK(error_of((s.dir / "fineweb_val_000000.bin").string()).find("has no training shard") != std::string::npos);
  // the fingerprint names the contents: the same twice, another after a shard changes
  const std::string fp = data::load_token_data(s.dir.string(), 8)->fingerprint;
  CHECK(fp.size() == 64);
  CHECK(data::load_token_data(s.dir.string(), 8)->fingerprint == fp);
  std::vector<uint16_t> t1b = s.t1;
  t1b[7] ^= 1;
  write(s.dir / "fineweb_train_000002.bin", shard_bytes(t1b));
  CHECK(data::load_token_data(s.dir.string(), 8)->fingerprint != fp);
  // through load_dataset: V from the data (GPT-2's), padded as llm.c pads it
  data::Dataset ds = data::load_dataset(s.dir.string(), 8);
  CHECK(ds.tokens);
  CHECK(ds.vocab_size() == 50257);
  CHECK(ds.padded_vocab() == 50304);
  CHECK(ds.train_size() == 500);
  CHECK(ds.sha256 == ds.tokens->fingerprint);
}

TEST_CASE("tokens: a nanoGPT directory (train.bin, val.bin: raw uint16)") {
  const fs::path dir = cli::fresh_dir("tg_tokens_nanogpt");
  const auto tr = some_tokens(64, 4), va = some_tokens(32, 5);
  write(dir / "train.bin", raw_bytes(tr));
  write(dir / "val.bin", raw_bytes(va));
  auto d = data::load_token_data(dir.string(), 8);
  CHECK(d->format == "nanoGPT");
  REQUIRE(d->train.size() == 64);
  REQUIRE(d->val.size() == 32);
  std::vector<int32_t> v(32);
  d->val.read(0, 32, v.data());
  for (int i = 0; i < 32; ++i) CHECK(v[i] == va[i]);
  write(dir / "val.bin", raw_bytes(va) + "x");
  CHECK(error_of(dir.string()).find("odd number") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("tokens: every damaged or missing shard is one clear error, and an id >= V is refused with its position") {
  const fs::path dir = cli::fresh_dir("tg_tokens_bad");
  const auto t = some_tokens(50, 6);
  auto one = [&](const std::string& train_bytes) {
    fs::remove_all(dir);
    write(dir / "x_train.bin", train_bytes);
    write(dir / "x_val.bin", shard_bytes(t));
    return error_of(dir.string());
  };
  CHECK(one(shard_bytes(t, 1234)).find("has magic 1234; expected 20240520") != std::string::npos);
  CHECK(one(shard_bytes(t, data::kShardMagic, 2)).find("has version 2; expected 1") != std::string::npos);
  CHECK(one(shard_bytes(t).substr(0, 1024 + 40)).find("truncated") != std::string::npos);
  CHECK(one(shard_bytes(t) + "zz").find("longer than declared") != std::string::npos);
  CHECK(one(shard_bytes(t).substr(0, 100)).find("shorter than its 1024-byte header") != std::string::npos);
  CHECK(one(shard_bytes(t, data::kShardMagic, 1, -5 & 0xffffffffLL)).find("expected a count >= 0") != std::string::npos);
  CHECK(one(shard_bytes(some_tokens(5, 1))).find("too few for one window") != std::string::npos);
  // no validation shard
  fs::remove_all(dir);
  write(dir / "x_train.bin", shard_bytes(t));
  CHECK(error_of(dir.string()).find("has no validation shard") != std::string::npos);
  CHECK(error_of((dir / "nothing_*.bin").string()).find("matches no file") != std::string::npos);
  fs::create_directories(dir / "empty");
  CHECK(error_of((dir / "empty").string()).find("no .bin files") != std::string::npos);
  // an id >= 50257: named with its file and position as a batch reads it, never read past
  std::vector<uint16_t> bad = t;
  bad[17] = 65535;
  fs::remove_all(dir);
  write(dir / "x_train.bin", shard_bytes(bad));
  write(dir / "x_val.bin", shard_bytes(t));
  auto d = data::load_token_data(dir.string(), 8);
  std::vector<int32_t> out(50);
  std::string msg;
  try {
    d->train.read(0, 50, out.data());
  } catch (const tg::InputError& e) {
    msg = e.what();
  }
  CHECK(msg.find("x_train.bin holds token id 65535 at token 17 (byte offset 1058)") != std::string::npos);
  // --data loads it with the ends of every file checked: refused at start, before a run writes its directory
  CHECK_THROWS_WITH_AS(data::load_dataset(dir.string(), 8), doctest::Contains("x_train.bin holds token id 65535 at token 17"),
                       tg::InputError);
  fs::remove_all(dir);
}

namespace {
std::string tokenizer_bytes(uint32_t version, const std::vector<std::string>& toks, uint32_t magic = data::kTokenizerMagic,
                            uint32_t eot = 0) {
  std::string s;
  put32(s, magic);
  put32(s, version);
  put32(s, (uint32_t)toks.size());
  put32(s, eot);
  s.resize(1024, '\0');
  for (const std::string& t : toks) {
    s += (char)t.size();
    s += t;
  }
  return s;
}
std::string tokenizer_error(const std::string& bytes) {
  const fs::path p = cli::fresh_dir("tg_tokenizer_bad");
  write(p / "tok.bin", bytes);
  std::string msg;
  try {
    data::Gpt2Tokenizer::load((p / "tok.bin").string());
  } catch (const tg::InputError& e) {
    msg = e.what();
  }
  fs::remove_all(p);
  return msg;
}
}  // namespace

TEST_CASE("tokens: llm.c's gpt2_tokenizer.bin (versions 1 and 2) decodes; damaged ones are refused") {
  const fs::path p = cli::fresh_dir("tg_tokenizer");
  const std::vector<std::string> toks = {"Hello", ",", " world", "\xc3", "\xa9", "<|endoftext|>"};
  write(p / "v1.bin", tokenizer_bytes(1, toks));
  write(p / "v2.bin", tokenizer_bytes(2, toks, data::kTokenizerMagic, 5));
  auto t1 = data::Gpt2Tokenizer::load((p / "v1.bin").string());
  CHECK(t1.tokens.size() == 6);
  CHECK(t1.eot == -1);
  const int32_t ids[] = {0, 1, 2, 3, 4};
  CHECK(t1.decode(ids, 5) == "Hello, world\xc3\xa9");
  auto t2 = data::Gpt2Tokenizer::load((p / "v2.bin").string());
  CHECK(t2.eot == 5);
  const int32_t out_of_range[] = {6};
  CHECK_THROWS_AS(t2.decode(out_of_range, 1), tg::InputError);
  fs::remove_all(p);

  CHECK(tokenizer_error(tokenizer_bytes(1, toks, 7)).find("has magic 7; expected 20240328") != std::string::npos);
  CHECK(tokenizer_error(tokenizer_bytes(3, toks)).find("has version 3; expected 1 or 2") != std::string::npos);
  CHECK(tokenizer_error(tokenizer_bytes(1, toks).substr(0, 1030)).find("truncated") != std::string::npos);
  CHECK(tokenizer_error(tokenizer_bytes(1, toks) + "x").find("bytes after its 6 tokens") != std::string::npos);
  CHECK(tokenizer_error(tokenizer_bytes(1, {"a", "", "b"})).find("length 0") != std::string::npos);
  CHECK(tokenizer_error(tokenizer_bytes(1, {})).find("declares 0 tokens") != std::string::npos);
  CHECK(tokenizer_error(tokenizer_bytes(2, toks, data::kTokenizerMagic, 99)).find("end-of-text id 99") != std::string::npos);
  CHECK(tokenizer_error("short").find("shorter than its 1024-byte header") != std::string::npos);
}

TEST_CASE("cli: training on llm.c shards: V 50257 padded to 50304, samples as ids or text, resume checks the shards") {
  using namespace cli;
  Shards s("tg_cli_tokens");
  const fs::path out = s.dir / "run";
  const std::string common = "--device cpu --n-layer 1 --n-head 2 --n-embd 16 --block-size 8 --batch-size 2 "
                             "--eval-interval 0 --eval-iters 1 --ckpt-interval 2 --data '" + (s.dir / "fineweb_*.bin").string() + "'";
  Run r = run_train_gpt(common + " --max-iters 4 --sample-tokens 5 --out-dir " + out.string());
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("(llm.c shards), vocab 50257 (padded to 50304), train 500 tokens, val 100 tokens") != std::string::npos);
  CHECK(r.out.find("---- sample (5 tokens") != std::string::npos);
  const std::string tail = r.out.substr(r.out.find("---- sample"));
  const std::string ids = tail.substr(tail.find('\n') + 1);
  CHECK(ids.rfind("50256 ", 0) == 0);  // from <|endoftext|>, then 5 ids
  std::istringstream in(ids);
  int n = 0;
  for (long id; in >> id; ++n) CHECK((id >= 0 && id < 50257));
  CHECK(n == 6);
  // resume goes on; a shard with other contents is refused, nothing written
  Run more = run_train_gpt("--resume --max-iters 6 --sample-tokens 0 --out-dir " + out.string());
  CAPTURE(more.err);
  CHECK(more.code == 0);
  // --sample from the checkpoint, printed as text with a tokenizer
  std::string tok;
  put32(tok, data::kTokenizerMagic);
  put32(tok, 1);
  put32(tok, 50257);
  tok.resize(1024, '\0');
  for (int i = 0; i < 50257; ++i) {
    const std::string t = "<" + std::to_string(i) + ">";
    tok += (char)t.size();
    tok += t;
  }
  write(s.dir / "tok" / "gpt2_tokenizer.bin", tok);
  Run smp = run_train_gpt("--sample --ckpt " + out.string() + " --sample-tokens 3 --tokenizer " +
                          (s.dir / "tok" / "gpt2_tokenizer.bin").string());
  CAPTURE(smp.err);
  CHECK(smp.code == 0);
  CHECK(smp.out.rfind("<50256><", 0) == 0);
  Run with_data = run_train_gpt("--sample --ckpt " + out.string() + " --sample-tokens 2 --data " + s.dir.string());
  CAPTURE(with_data.err);
  CHECK(with_data.code == 0);  // the same shards, named by their directory: the same fingerprint
  write(s.dir / "other" / "a_train.bin", shard_bytes(some_tokens(100, 8)));
  write(s.dir / "other" / "a_val.bin", shard_bytes(some_tokens(100, 9)));
  Run other_data = run_train_gpt("--sample --ckpt " + out.string() + " --data " + (s.dir / "other").string());
  CHECK(other_data.code == 2);  // other shards: refused, not ignored
  Run prompt = run_train_gpt("--sample --ckpt " + out.string() + " --prompt hi");
  CHECK(prompt.code == 2);
  CHECK(prompt.err.find("--prompt with token data and no tokenizer") != std::string::npos);
  Run prompt_llmc = run_train_gpt("--sample --ckpt " + out.string() + " --prompt hi --tokenizer " +
                                  (s.dir / "tok" / "gpt2_tokenizer.bin").string());
  CHECK(prompt_llmc.code == 2);
  CHECK(prompt_llmc.err.find("llm.c's tokenizer file, which only decodes") != std::string::npos);
  write(s.dir / "fineweb_train_000002.bin", shard_bytes(some_tokens(200, 99)));
  const std::string metrics = slurp((out / "metrics.jsonl").string());
  Run changed = run_train_gpt("--resume --max-iters 8 --out-dir " + out.string());
  CHECK(changed.code == 2);
  CHECK(std::count(changed.err.begin(), changed.err.end(), '\n') == 1);
  CHECK(slurp((out / "metrics.jsonl").string()) == metrics);
  // a damaged shard: one line, exit 2, no run directory made
  write(s.dir / "fineweb_train_000002.bin", shard_bytes(some_tokens(200, 2)).substr(0, 1100));
  const fs::path out2 = s.dir / "run2";
  Run bad = run_train_gpt(common + " --max-iters 2 --out-dir " + out2.string());
  CHECK(bad.code == 2);
  CHECK(bad.err.find("is truncated") != std::string::npos);
  CHECK(std::count(bad.err.begin(), bad.err.end(), '\n') == 1);
  CHECK(!fs::exists(out2));
  // an id past the vocabulary where the start's check of each file's ends does not look (a shard
  // of 1.5M tokens: its middle): refused when a batch reads it, and the new run that had written
  // its directory takes it back, so that the command, the shard regenerated, starts afresh
  std::vector<uint16_t> big = some_tokens(1500000, 5);
  std::fill(big.begin() + 600000, big.begin() + 900000, (uint16_t)60000);
  const fs::path mid = s.dir / "mid";
  write(mid / "fineweb_train_000000.bin", shard_bytes(big));
  write(mid / "fineweb_val_000000.bin", shard_bytes(some_tokens(100, 6)));
  const std::string mid_cmd = "--device cpu --n-layer 1 --n-head 2 --n-embd 16 --block-size 8 --batch-size 8 "
                              "--eval-interval 0 --eval-iters 1 --ckpt-interval 0 --sample-tokens 0 --max-iters 20 --data " +
                              mid.string() + " --out-dir " + (s.dir / "made" / "run").string();
  Run mid_bad = run_train_gpt(mid_cmd);
  CHECK(mid_bad.code == 2);
  CHECK(count_lines(mid_bad.err) == 1);
  CHECK(mid_bad.err.find("holds token id 60000") != std::string::npos);
  CHECK(mid_bad.err.find("wrote no checkpoint and is removed") != std::string::npos);
  CHECK(!fs::exists(s.dir / "made"));  // the directories it created too
  std::fill(big.begin() + 600000, big.begin() + 900000, (uint16_t)7);
  write(mid / "fineweb_train_000000.bin", shard_bytes(big));
  Run mid_again = run_train_gpt(mid_cmd);
  CAPTURE(mid_again.err);
  CHECK(mid_again.code == 0);
  // a text with llm.c's tokenizer file is refused: it decodes only (tests/cpu/test_bpe_cli.cpp: a BPE that encodes)
  Run text_tok = run_train_gpt("--device cpu --max-iters 1 --data " + data_path() + " --tokenizer " +
                               (s.dir / "tok" / "gpt2_tokenizer.bin").string() + " --out-dir " + (s.dir / "run3").string());
  CHECK(text_tok.code == 2);
  CHECK(text_tok.err.find("only decodes") != std::string::npos);
  CHECK(!fs::exists(s.dir / "run3"));
}
