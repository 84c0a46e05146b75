// tests/cpu/test_bpe_cli.cpp: GPT-2's tokenizer where a user meets it, through the binary: a text
// trained in BPE tokens (split as nanoGPT's prepare.py, cached), --prompt for models of tokens,
// the tokenizer kept in the run directory for --sample, --tokenize into llm.c shards,
// --init-from a model name in the Hugging Face cache, and the refusals (exit 2, one line,
// nothing written). The tokenizers are tests/interop/bpe's (tests/cpu/test_bpe.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../../data/bpe.h"
#include "../../data/tokenize.h"
#include "../common/cli_util.h"

namespace fs = std::filesystem;

namespace {

const std::string kBpe = "tests/interop/bpe";
const std::string kTiny = "--device cpu --n-layer 1 --n-head 2 --n-embd 16 --block-size 8 --batch-size 2 "
                          "--eval-interval 0 --eval-iters 1 --ckpt-interval 0 ";

std::string abs_path(const std::string& p) { return fs::absolute(p).string(); }

void write(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

// The ids of an llm.c shard (its header checked).
std::vector<int32_t> shard_ids(const std::string& path) {
  const std::string b = cli::slurp(path);
  REQUIRE(b.size() >= 1024);
  int32_t h[3];
  std::memcpy(h, b.data(), sizeof h);
  CHECK(h[0] == 20240520);
  CHECK(h[1] == 1);
  REQUIRE(b.size() == 1024 + 2 * (size_t)h[2]);
  std::vector<int32_t> ids((size_t)h[2]);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = (uint8_t)b[1024 + 2 * i] | (uint8_t)b[1025 + 2 * i] << 8;
  return ids;
}

}  // namespace

TEST_CASE("bpe cli: a text trained in BPE tokens, cached once; --prompt; the tokenizer kept for --sample") {
  using namespace cli;
  const fs::path d = fresh_dir("tg_bpe_cli");
  const std::string env = "env TG_CACHE_DIR=" + (d / "cache").string() + " ";
  const std::string tok = abs_path(kBpe + "/shakes1k");
  const std::string text = slurp(data_path());
  REQUIRE(text.size() == 1115394);
  const data::SplitIds want = data::encode_split(text, data::BpeTokenizer::load(tok), "tiny Shakespeare");
  const std::string common = kTiny + "--max-iters 2 --data " + data_path() + " --tokenizer " + tok;
  Run r = run_train_gpt_prefixed(env, common + " --sample-tokens 6 --prompt 'ROMEO:' --out-dir " + (d / "run").string());
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("vocab 1257 (padded to 1280), train " + std::to_string(want.train.size()) + " tokens, val " +
                   std::to_string(want.val.size()) + " tokens") != std::string::npos);
  CHECK(r.out.find("tokenized data file") != std::string::npos);
  CHECK(r.out.find("\nROMEO:") != std::string::npos);  // the sample starts from the prompt
  CHECK(cli::slurp((d / "run" / "tokenizer" / "tokenizer.json").string()) == cli::slurp(tok + "/tokenizer.json"));
  // the cache holds nanoGPT's train.bin / val.bin: prepare.py's split, each part encoded alone
  std::vector<fs::path> caches;
  for (const auto& e : fs::recursive_directory_iterator(d / "cache"))
    if (e.path().filename() == "train.bin") caches.push_back(e.path());
  REQUIRE(caches.size() == 1);
  CHECK(fs::file_size(caches[0]) == 2 * want.train.size());
  CHECK(fs::file_size(caches[0].parent_path() / "val.bin") == 2 * want.val.size());
  // a second run reuses it
  Run again = run_train_gpt_prefixed(env, common + " --sample-tokens 0 --out-dir " + (d / "run2").string());
  CAPTURE(again.err);
  CHECK(again.code == 0);
  CHECK(again.out.find("reusing the tokens in") != std::string::npos);
  // --sample needs no other file: the run directory keeps the tokenizer
  Run smp = run_train_gpt("--sample --ckpt " + (d / "run").string() + " --prompt 'JULIET:' --sample-tokens 4");
  CAPTURE(smp.err);
  CHECK(smp.code == 0);
  CHECK(smp.out.rfind("JULIET:", 0) == 0);
  // --resume reads the kept tokenizer too
  Run more = run_train_gpt_prefixed(env, "--resume --max-iters 3 --sample-tokens 0 --out-dir " + (d / "run").string());
  CAPTURE(more.err);
  CHECK(more.code == 0);
  // refused, one line, exit 2: a prompt that is not UTF-8; a tokenizer smaller than the model's vocabulary
  Run bad_prompt = run_train_gpt("--sample --ckpt " + (d / "run").string() + " --prompt \"$(printf 'ab\\377')\"");
  CHECK(bad_prompt.code == 2);
  CHECK(bad_prompt.err.find("--prompt is not valid UTF-8: byte 0xff at byte offset 2") != std::string::npos);
  CHECK(count_lines(bad_prompt.err) == 1);
  Run small = run_train_gpt("--sample --ckpt " + (d / "run").string() + " --tokenizer " + abs_path(kBpe + "/tiny.tiktoken"));
  CHECK(small.code == 2);
  CHECK(small.err.find("holds 257 tokens but the model has 1257") != std::string::npos);
  // a prompt refused before training: nothing written
  Run bad_train = run_train_gpt_prefixed(env, common + " --prompt \"$(printf '\\300')\" --out-dir " + (d / "run3").string());
  CHECK(bad_train.code == 2);
  CHECK(bad_train.err.find("--prompt is not valid UTF-8") != std::string::npos);
  CHECK(!fs::exists(d / "run3"));
  // llm.c's file only decodes: a text cannot be trained in its tokens
  Run llmc = run_train_gpt_prefixed(env, common.substr(0, common.find("--tokenizer")) + "--tokenizer " +
                                             abs_path(kBpe + "/tiny_llmc.bin") + " --out-dir " + (d / "run4").string());
  CHECK(llmc.code == 2);
  CHECK(llmc.err.find("only decodes") != std::string::npos);
  CHECK(!fs::exists(d / "run4"));
  fs::remove_all(d);
}

TEST_CASE("bpe cli: --tokenize writes llm.c shards of prepare.py's split; training on them; refusals write nothing") {
  using namespace cli;
  const fs::path d = fresh_dir("tg_bpe_tokenize");
  const std::string tok = abs_path(kBpe + "/shakes8k/shakes8k.tiktoken");
  const std::string text = slurp(data_path());
  const data::SplitIds want = data::encode_split(text, data::BpeTokenizer::load(tok), "tiny Shakespeare");
  Run r = run_train_gpt("--tokenize " + data_path() + " --tokenizer " + tok + " --out " + (d / "shards").string());
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  const std::string stem = fs::path(data_path()).stem().string();
  CHECK(shard_ids((d / "shards" / (stem + "_train.bin")).string()) == want.train);
  CHECK(shard_ids((d / "shards" / (stem + "_val.bin")).string()) == want.val);
  CHECK(r.err.find("split 90/10 by characters") != std::string::npos);
  // training on them with the same tokenizer: its vocabulary, a prompt
  Run t = run_train_gpt(kTiny + "--max-iters 1 --data " + (d / "shards").string() + " --tokenizer " + tok +
                        " --sample-tokens 3 --prompt 'To be' --out-dir " + (d / "run").string());
  CAPTURE(t.err);
  CHECK(t.code == 0);
  CHECK(t.out.find("(llm.c shards), vocab 8257 (padded to 8320)") != std::string::npos);
  CHECK(t.out.find("\nTo be") != std::string::npos);
  // ids past a smaller tokenizer's vocabulary: refused before the run begins (the ends of every
  // file are checked at start), nothing written
  Run small = run_train_gpt(kTiny + "--max-iters 1 --data " + (d / "shards").string() + " --tokenizer " +
                            abs_path(kBpe + "/shakes1k") + " --out-dir " + (d / "run2").string());
  CHECK(small.code == 2);
  CHECK(small.err.find("expected ids below the vocabulary size 1257 (the tokenizer's)") != std::string::npos);
  CHECK(count_lines(small.err) == 1);
  CHECK(!fs::exists(d / "run2"));
  // --prompt with token data and no tokenizer
  Run no_tok = run_train_gpt(kTiny + "--max-iters 1 --data " + (d / "shards").string() + " --prompt hi --out-dir " +
                             (d / "run3").string());
  CHECK(no_tok.code == 2);
  CHECK(no_tok.err.find("--prompt with token data and no tokenizer") != std::string::npos);
  CHECK(!fs::exists(d / "run3"));
  // refusals of --tokenize: one line, exit 2, no output directory
  write(d / "bad.txt", "fine text\nthen a bad byte \xfe here\n");
  std::string big = "{";  // 65537 tokens: past uint16
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--tokenize " + (d / "bad.txt").string() + " --tokenizer " + tok, "byte 0xfe at byte offset 26 (line 2)"},
      {"--tokenize " + data_path() + " --tokenizer " + abs_path(kBpe + "/tiny_llmc.bin"), "only decodes"},
      {"--tokenize " + data_path() + " --tokenizer " + (d / "big.tiktoken").string(), "too many for uint16 token files"},
      {"--tokenize " + data_path() + " --tokenizer " + abs_path(kBpe + "/hostile.txt"), "not a tokenizer file"},
      {"--tokenize " + (d / "none.txt").string() + " --tokenizer " + tok, "does not exist"},
      {"--tokenize " + data_path() + " --out " + (d / "out").string(), "--tokenize without --tokenizer"},
      {"--tokenize " + data_path() + " --tokenizer " + tok + " --tokenizer " + abs_path(kBpe + "/tiny_llmc.bin"),
       "--tokenize: option --tokenizer given twice; expected it at most once"},
  };
  // big.tiktoken: every byte, then 65280 two-byte tokens (written here, not committed)
  {
    std::string b;
    const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    int rank = 0;
    for (int x = 0; x < 256; ++x) b += std::string{a[x >> 2], a[(x & 3) << 4], '=', '='} + " " + std::to_string(rank++) + "\n";
    for (int x = 0; x < 256 && rank < 65536; ++x)
      for (int y = 1; y < 256 && rank < 65536; ++y)
        b += std::string{a[x >> 2], a[(x & 3) << 4 | y >> 4], a[(y & 15) << 2], '='} + " " + std::to_string(rank++) + "\n";
    write(d / "big.tiktoken", b);
  }
  for (const auto& [args, says] : cases) {
    Run bad = run_train_gpt(args + (args.find("--out") == std::string::npos ? " --out " + (d / "out").string() : ""));
    CAPTURE(args);
    CAPTURE(bad.err);
    CHECK(bad.code == 2);
    CHECK(bad.err.find(says) != std::string::npos);
    CHECK(count_lines(bad.err) == 1);
    CHECK(!fs::exists(d / "out"));
  }
  fs::remove_all(d);
}

TEST_CASE("bpe cli: --init-from a model name finds the Hugging Face cache's snapshot and its tokenizer, or says how to get it") {
  using namespace cli;
  const fs::path d = fresh_dir("tg_bpe_hub");
  const std::string tok = abs_path(kBpe + "/shakes1k");
  const std::string env = "env TG_CACHE_DIR=" + (d / "cache").string() + " HF_HUB_CACHE=" + (d / "hub").string() + " ";
  Run missing = run_train_gpt_prefixed(env, kTiny + "--max-iters 1 --init-from gpt2 --out-dir " + (d / "x").string());
  CHECK(missing.code == 2);
  CHECK(missing.err.find("huggingface-cli download gpt2") != std::string::npos);
  CHECK(count_lines(missing.err) == 1);
  // a model of shakes1k's tokens, exported as Hugging Face's GPT-2 with the tokenizer beside it
  Run r = run_train_gpt_prefixed(env, kTiny + "--max-iters 1 --sample-tokens 0 --data " + data_path() + " --tokenizer " + tok +
                                          " --out-dir " + (d / "run").string());
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  const fs::path snap = d / "hub" / "models--gpt2" / "snapshots" / "0123abcd";
  Run ex = run_train_gpt("--export-hf " + snap.string() + " --ckpt " + (d / "run").string());
  CAPTURE(ex.err);
  REQUIRE(ex.code == 0);
  CHECK(fs::exists(snap / "tokenizer.json"));
  // --init-from gpt2: the snapshot, and its tokenizer for the text
  Run init = run_train_gpt_prefixed(env, kTiny + "--max-iters 1 --sample-tokens 3 --prompt 'KING' --init-from gpt2 --data " +
                                             data_path() + " --out-dir " + (d / "run2").string());
  CAPTURE(init.err);
  CHECK(init.code == 0);
  CHECK(init.out.find("init: weights from " + snap.string()) != std::string::npos);
  CHECK(init.out.find("vocab 1257 (padded to 1280)") != std::string::npos);
  CHECK(init.out.find("\nKING") != std::string::npos);
  fs::remove_all(d);
}
