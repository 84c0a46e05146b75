// tests/cpu/test_bpe.cpp: GPT-2's byte-level BPE (data/bpe.h) against Hugging Face tokenizers and
// tiktoken, with no Python: tests/interop/tokenizer_check.py trained two byte-level BPEs (1,000
// and 8,000 merges) on tiny Shakespeare with `tokenizers`, wrote them in GPT-2's formats
// (tests/interop/bpe/<name>/), and recorded for each corpus the sha256 of the ids of both
// libraries (expected.json). Here every format read by train_gpt must give those very ids on
// tiny Shakespeare (TG_DATA), the hostile corpus (tests/interop/bpe/hostile.txt), a megabyte
// with no space and one piece of 30,000 letters; decode(encode(x)) must give x back; invalid UTF-8 is refused with its offset;
// malformed files are refused in one line.
#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "data/bpe.h"
#include "data/errors.h"
#include "data/sha256.h"
#include "data/tokenize.h"
#include "data/tokens.h"

namespace {

const std::string kDir = "tests/interop/bpe";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string shakespeare() {
  const char* env = std::getenv("TG_DATA");
  return slurp(env && *env ? env : "data/tinyshakespeare/input.txt");
}

// tokenizer_check.py's nospace_megabyte(): the same words, in turn, up to 1 MiB
std::string nospace_megabyte() {
  auto rep = [](const std::string& s, int k) {
    std::string r;
    for (int i = 0; i < k; ++i) r += s;
    return r;
  };
  const std::vector<std::string> words = {rep("a", 4096), rep("Zz", 700), "\xc3\xa9t\xc3\xa9", rep("1234567890", 50),
                                          rep("!?", 300), rep("\xe4\xb8\xad\xe6\x96\x87", 200),
                                          "\xe0\xa4\x95\xe0\xa4\xbf\xe0\xa4\xa4\xe0\xa4\xbe\xe0\xa4\xac",
                                          "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb", "don't'S're",
                                          "\xd9\xa1\xd9\xa2\xd9\xa3"};
  std::string s;
  for (size_t i = 0; s.size() < (1u << 20); ++i) s += words[i % words.size()];
  return s;
}

std::string ids_sha256(const std::vector<int32_t>& ids) {
  std::string b(4 * ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i)
    for (int k = 0; k < 4; ++k) b[4 * i + (size_t)k] = (char)((uint32_t)ids[i] >> (8 * k));
  return data::sha256_hex(b.data(), b.size());
}

std::vector<std::string> pieces(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t end : data::pretokenize(s.data(), s.size())) {
    out.push_back(s.substr(at, end - at));
    at = end;
  }
  return out;
}

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const tg::InputError& e) {
    return e.what();
  }
  return "(not refused)";
}

// A vocab.json of GPT-2's 256 byte characters (id = byte), then the entries given.
std::string alphabet_vocab(const std::string& more) {
  std::string v = "{";
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const unsigned cp = self ? (unsigned)b : 256u + (unsigned)extra++;
    std::string ch;
    if (cp < 0x80) ch = std::string(1, (char)cp);
    else ch = std::string{(char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F))};
    if (ch == "\"" || ch == "\\") ch = "\\" + ch;
    v += "\"" + ch + "\": " + std::to_string(b) + ", ";
  }
  return v + more + "}";
}

}  // namespace

TEST_CASE("bpe: the pre-tokenizer cuts as GPT-2's pattern does (pieces from tokenizers' ByteLevel)") {
  using V = std::vector<std::string>;
  CHECK(pieces("Hello world") == V{"Hello", " world"});
  CHECK(pieces("  x") == V{" ", " x"});
  CHECK(pieces("a  \n\nb") == V{"a", "  \n", "\n", "b"});
  CHECK(pieces("don't") == V{"don", "'t"});
  CHECK(pieces("'S'sX") == V{"'", "S", "'s", "X"});
  CHECK(pieces("x \n") == V{"x", " \n"});
  CHECK(pieces(" ") == V{" "});
  CHECK(pieces("1 2") == V{"1", " 2"});
  CHECK(pieces("a1b") == V{"a", "1", "b"});
  CHECK(pieces("\xc3\xa9!? 12.5") == V{"\xc3\xa9", "!?", " 12", ".", "5"});
  CHECK(pieces("x\t\t y  ") == V{"x", "\t\t", " y", "  "});
  CHECK(pieces("!!'s") == V{"!!'", "s"});
  CHECK(pieces(" \xe4\xb8\xad\xe6\x96\x87") == V{" \xe4\xb8\xad\xe6\x96\x87"});
  CHECK(pieces("a\xcc\x81" "b") == V{"a", "\xcc\x81", "b"});
  CHECK(pieces("'ll've're") == V{"'ll", "'ve", "'re"});
  CHECK(pieces("\n\n") == V{"\n\n"});
  CHECK(pieces("a \xc2\xa0" "b") == V{"a", " ", "\xc2\xa0", "b"});
  CHECK(pieces("").empty());
}

TEST_CASE("bpe: the character classes are the regex engines' (Unicode 16.0 letters, numbers, White_Space)") {
  using data::CharClass;
  CHECK(data::char_class(U'a') == CharClass::Letter);
  CHECK(data::char_class(U'7') == CharClass::Number);
  CHECK(data::char_class(U' ') == CharClass::Space);
  CHECK(data::char_class(U'!') == CharClass::Other);
  CHECK(data::char_class(0x1C89) == CharClass::Letter);   // new in Unicode 16.0
  CHECK(data::char_class(0x1E6C0) == CharClass::Other);   // new in Unicode 17.0: neither engine has it
  CHECK(data::char_class(0x001C) == CharClass::Other);    // str.isspace() says space; the engines do not
  CHECK(data::char_class(0x0085) == CharClass::Space);
  CHECK(data::char_class(0x3000) == CharClass::Space);
  CHECK(data::char_class(0x200B) == CharClass::Other);    // zero width space: not White_Space
  CHECK(data::char_class(0x00BD) == CharClass::Number);   // No
  CHECK(data::char_class(0x2167) == CharClass::Number);   // Nl
  CHECK(data::char_class(0x0301) == CharClass::Other);    // Mn
  CHECK(data::char_class(0x20000) == CharClass::Letter);  // CJK extension B
  CHECK(data::char_class(0x10FFFF) == CharClass::Other);
}

TEST_CASE("bpe: every format gives the ids of tokenizers and tiktoken on tiny Shakespeare, the hostile corpus and a megabyte with no space") {
  const nlohmann::json expected = nlohmann::json::parse(slurp(kDir + "/expected.json"));
  const std::string shakes = shakespeare();
  REQUIRE_MESSAGE(shakes.size() == 1115394, "tiny Shakespeare not found: set TG_DATA or run make data");
  std::string letters;  // tokenizer_check.py's letters_30k: one piece with merges all along it
  for (char ch : shakes)
    if (letters.size() < 30000 && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'))) letters += ch;
  const std::map<std::string, std::string> corpora = {{"tinyshakespeare", shakes},
                                                      {"hostile", slurp(kDir + "/hostile.txt")},
                                                      {"nospace_mb", nospace_megabyte()},
                                                      {"letters_30k", letters}};
  REQUIRE(corpora.at("hostile").size() > 100000);
  struct Case {
    std::string name, path, library;
  };
  const std::vector<Case> cases = {
      {"shakes1k", kDir + "/shakes1k/vocab.json", "tokenizers"},
      {"shakes1k", kDir + "/shakes1k/tokenizer.json", "tokenizers"},
      {"shakes1k", kDir + "/shakes1k/shakes1k.tiktoken", "tiktoken"},
      {"shakes8k", kDir + "/shakes8k", "tokenizers"},
      {"shakes8k", kDir + "/shakes8k/shakes8k.tiktoken", "tiktoken"},
  };
  for (const Case& c : cases) {
    const data::BpeTokenizer t = data::BpeTokenizer::load(c.path);
    CHECK(t.vocab_size() == (c.name == "shakes1k" ? 1257 : 8257));
    CHECK(t.eot() == t.vocab_size() - 1);
    CHECK(t.decode(std::vector<int32_t>{t.eot()}.data(), 1) == "<|endoftext|>");
    for (const auto& [cname, text] : corpora) {
      CAPTURE(c.path);
      CAPTURE(cname);
      const std::vector<int32_t> ids = t.encode(text);
      const nlohmann::json& e = expected[c.name][cname];
      CHECK(ids.size() == e["count"].get<size_t>());
      CHECK(ids_sha256(ids) == e[c.library].get<std::string>());
      CHECK(t.decode(ids.data(), ids.size()) == text);
    }
  }
}

TEST_CASE("bpe: encoding on every core gives the ids of one core; a megabyte of one letter is linear") {
  const data::BpeTokenizer t = data::BpeTokenizer::load(kDir + "/shakes8k");
  std::string text = shakespeare();
  REQUIRE(text.size() == 1115394);
  text = text + "\n\xe4\xb8\xad  x\n" + text + "\n \n" + text;  // several parts of 1 MiB
  CHECK(t.encode_parallel(text.data(), text.size()) == t.encode(text));
  // lines ending in spaces (a part cut after " \n" would keep " \n" whole, the text splits it),
  // tabs and U+3000 before the newline, all but every tenth line
  std::string ragged;
  int line = 0;
  for (char ch : text) {
    if (ch == '\n' && ++line % 10) ragged += line % 3 == 0 ? "  " : line % 3 == 1 ? "\t" : "\xe3\x80\x80";
    ragged += ch;
  }
  CHECK(t.encode_parallel(ragged.data(), ragged.size()) == t.encode(ragged));
  // a tokenizer where " \n" is one token (U+0120 U+010A): a part cut after "x \n" would end in
  // that token where the whole text has " " then "\n"
  const data::BpeTokenizer sn =
      data::BpeTokenizer::from_vocab_merges(alphabet_vocab("\"\u0120\u010a\": 256"), "\u0120 \u010a\n", "sn/vocab.json");
  CHECK(sn.encode("x \n") == std::vector<int32_t>{120, 256});
  CHECK(sn.encode("x \ny") == std::vector<int32_t>{120, 32, 10, 121});
  std::string lines;
  for (int i = 0; lines.size() < (3u << 20); ++i) lines += i % 10 ? "to be \n" : "or not\n";
  CHECK(sn.encode_parallel(lines.data(), lines.size()) == sn.encode(lines));
  const std::string mb(1 << 20, 'a');
  for (const std::string& path : {kDir + "/shakes8k", kDir + "/shakes8k/shakes8k.tiktoken"}) {
    const data::BpeTokenizer u = data::BpeTokenizer::load(path);
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = u.encode(mb);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CAPTURE(path);
    CHECK(u.decode(ids.data(), ids.size()) == mb);
    CHECK(s < 1.0);  // tens of milliseconds; a quadratic merge loop takes minutes
  }
}

TEST_CASE("bpe: invalid UTF-8 is refused with its byte offset, on one core and on all") {
  const data::BpeTokenizer t = data::BpeTokenizer::load(kDir + "/shakes1k/shakes1k.tiktoken");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"ab\xff" "cd", "byte 0xff at byte offset 2 (line 1)"},
      {"x\n\xc0\xaf", "byte 0xc0 at byte offset 2 (line 2)"},        // overlong
      {"\xed\xa0\x80", "byte 0xed at byte offset 0"},                // a surrogate
      {"abc \xe4\xb8", "byte 0xe4 at byte offset 4"},                // cut short
      {"\xf4\x90\x80\x80", "byte 0xf4 at byte offset 0"},            // past U+10FFFF
      {"caf\xc3\xa9 \x80", "byte 0x80 at byte offset 6"},            // a stray continuation byte
  };
  for (const auto& [text, says] : bad) {
    CAPTURE(text);
    const std::string m = refusal([&] { t.encode(text, "--prompt"); });
    CHECK(m.find("--prompt is not valid UTF-8: " + says) != std::string::npos);
    CHECK(m.find("\n") == std::string::npos);
    CHECK(refusal([&] { data::pretokenize(text.data(), text.size()); }) != "(not refused)");
  }
  std::string big(3 << 20, 'a');
  for (size_t i = 100; i < big.size(); i += 100) big[i] = '\n';
  big[(2 << 20) + 7] = '\xfe';
  const std::string m = refusal([&] { t.encode_parallel(big.data(), big.size()); });
  CHECK(m.find("byte 0xfe at byte offset " + std::to_string((2 << 20) + 7)) != std::string::npos);
}

TEST_CASE("bpe: a tokenizer file that is not GPT-2's shape is refused in one line saying what, expected and how to fix") {
  const std::string vocab = R"({"a": 0, "b": 1, "ab": 2})";
  // every byte a token: the 256 characters of GPT-2's alphabet, then "ab"
  const std::string full = alphabet_vocab("\"ab\": 256, \"<|endoftext|>\": 257");
  const data::BpeTokenizer ok = data::BpeTokenizer::from_vocab_merges(full, "#version: 0.2\na b\n", "t/vocab.json");
  CHECK(ok.vocab_size() == 258);
  CHECK(ok.eot() == 257);
  CHECK(ok.encode("abab xab") == std::vector<int32_t>{256, 256, 32, 120, 256});
  const std::vector<std::pair<std::function<void()>, std::string>> cases = {
      {[&] { data::BpeTokenizer::from_vocab_merges(full, "a c\n", "t/vocab.json"); },
       "merges.txt line 1 merges \"a\" and \"c\" but the vocabulary lacks \"ac\""},
      {[&] { data::BpeTokenizer::from_vocab_merges(full, "a b\na b\n", "t/vocab.json"); }, "repeats the merge"},
      {[&] { data::BpeTokenizer::from_vocab_merges(full, "a b c\n", "t/vocab.json"); }, "expected two tokens separated by one space"},
      {[&] { data::BpeTokenizer::from_vocab_merges(vocab, "a b\n", "t/vocab.json"); }, "no token is the single byte 0"},
      {[&] { data::BpeTokenizer::from_vocab_merges("[1, 2]", "", "t/vocab.json"); }, "the vocabulary is not a JSON object"},
      {[&] { data::BpeTokenizer::from_vocab_merges("{\"a\": 5}", "", "t/vocab.json"); }, "expected ids 0 to 0"},
      {[&] { data::BpeTokenizer::from_vocab_merges("{\"\xe4\xb8\xad\": 0}", "", "t/vocab.json"); },
       "outside GPT-2's byte-to-unicode alphabet"},
      {[&] { data::BpeTokenizer::from_vocab_merges("{\"a\": 0", "", "t/vocab.json"); }, "vocab.json is not JSON"},
      {[&] { data::BpeTokenizer::from_tokenizer_json(R"({"model": {"type": "WordPiece", "vocab": {}}})", "t.json"); },
       "the model is not BPE; expected GPT-2's shape"},
      {[&] {
         data::BpeTokenizer::from_tokenizer_json(
             R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": {"type": "Whitespace"}})", "t.json");
       },
       "the pre-tokenizer is not ByteLevel"},
      {[&] {
         data::BpeTokenizer::from_tokenizer_json(R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer":
             {"type": "ByteLevel", "add_prefix_space": true}})", "t.json");
       },
       "adds a prefix space"},
      {[&] { data::BpeTokenizer::from_tiktoken("YQ== 0\nYg== 0\n", "x.tiktoken"); }, "rank 0 is given twice"},
      {[&] { data::BpeTokenizer::from_tiktoken("YQ== 0\n!!!! 1\n", "x.tiktoken"); }, "line 2"},
      {[&] { data::BpeTokenizer::from_tiktoken("YQ== 0\n", "x.tiktoken"); }, "no token is the single byte 0"},
      {[&] { data::BpeTokenizer::from_tiktoken("", "x.tiktoken"); }, "holds no token"},
      {[&] { data::BpeTokenizer::load("tests/interop/bpe/no_such_dir/"); }, "does not exist"},
      {[&] { data::BpeTokenizer::load("tests/interop"); }, "a directory without tokenizer.json or vocab.json"},
      {[&] { data::BpeTokenizer::load("tests/interop/bpe"); }, "holding several tokenizer files (tiny.tiktoken, tiny_llmc.bin)"},
  };
  for (const auto& [f, says] : cases) {
    const std::string m = refusal(f);
    CAPTURE(m);
    CHECK(m.find(says) != std::string::npos);
    CHECK(m.find("; expected") != std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
  }
}

TEST_CASE("bpe: ids above 32767 survive llm.c shards (uint16, little-endian) and decode back") {
  // a tiktoken file of 40,000 ranks: the 256 bytes, then the two-byte tokens [x, y] (y > 0) in
  // order, rank 256 + 255 x + y - 1: those with x >= 128 have ranks above 32767
  const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string ranks;
  int rank = 0;
  for (int x = 0; x < 256; ++x) ranks += std::string{a[x >> 2], a[(x & 3) << 4], '=', '='} + " " + std::to_string(rank++) + "\n";
  for (int x = 0; x < 256 && rank < 40000; ++x)
    for (int y = 1; y < 256 && rank < 40000; ++y)
      ranks += std::string{a[x >> 2], a[(x & 3) << 4 | y >> 4], a[(y & 15) << 2], '='} + " " + std::to_string(rank++) + "\n";
  const data::BpeTokenizer t = data::BpeTokenizer::from_tiktoken(ranks, "big.tiktoken");
  REQUIRE(t.vocab_size() == 40001);
  // byte pairs inside CJK characters merge into ranks past 32767 (0x96 0x87 of U+6587: 38640)
  std::string text;
  for (int i = 0; i < 2000; ++i) text += (i % 7 ? "\xe4\xb8\xad\xe6\x96\x87" : " a\xe6\x97\xa5\n");
  const std::vector<int32_t> ids = t.encode(text);
  CHECK(*std::max_element(ids.begin(), ids.end()) > 32767);
  const std::string dir = (std::filesystem::temp_directory_path() / ("tg_bpe_u16_" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  data::write_llmc_shard(dir + "/x_train.bin", ids);
  data::write_llmc_shard(dir + "/x_val.bin", ids);
  const auto td = data::load_token_data(dir, 8, t.vocab_size(), "", true);
  std::vector<int32_t> back(ids.size());
  td->train.read(0, ids.size(), back.data());
  CHECK(back == ids);
  CHECK(t.decode(back.data(), back.size()) == text);
  std::filesystem::remove_all(dir);
}
