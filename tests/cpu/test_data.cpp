// tests/cpu/test_data.cpp: the char-level tiny Shakespeare pipeline (data/dataset.h):
// tokenizer, split sizes, the stateless batch sampler and load_dataset's errors; the SHA-256
// that names a data file (data/sha256.h).
// The data file is $TG_DATA (default data/tinyshakespeare/input.txt); when it is missing the
// tests fail and say to run `make data`.
#include <doctest/doctest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/sha256.h"
#include "kernels/philox.h"
#include "data/errors.h"

namespace {

std::string data_path() {
  const char* env = std::getenv("TG_DATA");
  return env && *env ? env : "data/tinyshakespeare/input.txt";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The text of tiny Shakespeare; fails the calling test when the file is not there.
const std::string& shakespeare_text() {
  static std::string text;
  if (text.empty()) {
    struct stat st;
    if (stat(data_path().c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      FAIL("tiny Shakespeare not found at '" << data_path()
           << "'; run `make data` (or set TG_DATA to the path of input.txt)");
    text = read_file(data_path());
    REQUIRE(text.size() == 1115394);
  }
  return text;
}

// load_dataset() of tiny Shakespeare, loaded once (block_size 256 as shakespeare-char).
const data::Dataset& shakespeare() {
  static data::Dataset d;
  static bool loaded = false;
  if (!loaded) {
    shakespeare_text();  // fails with the `make data` hint when missing
    auto t0 = std::chrono::steady_clock::now();
    d = data::load_dataset(data_path(), 256);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("load_dataset (read + tokenize + split) of " << data_path() << ": " << ms << " ms");
    loaded = true;
  }
  return d;
}

// tokens[i] = i: a window's first x token is its start.
std::vector<int32_t> iota_tokens(size_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

struct Batch {
  std::vector<int32_t> x, y;
  Batch(int B, int T) : x((size_t)B * T), y((size_t)B * T) {}
  bool operator==(const Batch& o) const { return x == o.x && y == o.y; }
};

Batch train(const std::vector<int32_t>& tok, uint64_t seed, uint32_t step, int B, int T) {
  Batch b(B, T);
  data::train_batch(tok, seed, step, B, T, b.x.data(), b.y.data());
  return b;
}

Batch eval(const std::vector<int32_t>& tok, uint64_t seed, uint32_t split, uint32_t k, int B, int T) {
  Batch b(B, T);
  data::eval_batch(tok, seed, split, k, B, T, b.x.data(), b.y.data());
  return b;
}

// The message of the tg::InputError load_dataset(path, block) throws; "" when it throws
// nothing, "<other exception>" for any other exception.
std::string load_error(const std::string& path, int block) {
  try {
    data::load_dataset(path, block);
  } catch (const tg::InputError& e) {
    return e.what();
  } catch (...) {
    return "<other exception>";
  }
  return "";
}

// A fresh directory under $TMPDIR (or /tmp), removed with its files at scope exit.
struct TempDir {
  std::string dir;
  std::vector<std::string> files;
  TempDir() {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/tg_test_data.XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    REQUIRE(mkdtemp(buf.data()) != nullptr);
    dir = buf.data();
  }
  std::string write(const std::string& name, const std::string& content) {
    std::string p = dir + "/" + name;
    std::ofstream(p, std::ios::binary) << content;
    files.push_back(p);
    return p;
  }
  ~TempDir() {
    for (auto& f : files) { chmod(f.c_str(), 0600); unlink(f.c_str()); }
    rmdir((dir + "/sub").c_str());
    rmdir(dir.c_str());
  }
};

// load_dataset(path, block) throws tg::InputError whose message names the path, says what
// was expected, and says what was wrong (contains `wrong`).
void check_load_error(const std::string& what, const std::string& path, int block,
                      const std::string& wrong) {
  std::string msg = load_error(path, block);
  INFO(what << ": message \"" << msg << "\"");
  CHECK(!msg.empty());
  CHECK(msg != "<other exception>");
  CHECK(msg.find(path) != std::string::npos);
  CHECK(msg.find("expected") != std::string::npos);
  CHECK(msg.find(wrong) != std::string::npos);
}

}  // namespace

TEST_CASE("data: tokenizer on tiny Shakespeare") {
  const std::string& text = shakespeare_text();
  data::CharTokenizer tok = data::CharTokenizer::from_text(text);
  REQUIRE(tok.vocab_size() == 65);
  CHECK(std::is_sorted(tok.itos.begin(), tok.itos.end()));
  CHECK(std::adjacent_find(tok.itos.begin(), tok.itos.end()) == tok.itos.end());
  CHECK(tok.itos[0] == '\n');
  CHECK(tok.itos[1] == ' ');
  CHECK(tok.itos[2] == '!');
  CHECK(tok.itos[64] == 'z');
  for (int c = 0; c < 256; ++c) {
    bool in_text = text.find((char)c) != std::string::npos;
    if (in_text) CHECK(tok.itos[tok.id((char32_t)c)] == (char32_t)c);
    else CHECK(tok.id((char32_t)c) == -1);
  }

  std::vector<int32_t> ids = tok.encode(text);
  REQUIRE(ids.size() == text.size());
  CHECK(ids[0] == tok.id(U'F'));  // "First Citizen:"
  CHECK(tok.decode(ids.data(), ids.size()) == text);

  // '@' is not in tiny Shakespeare.
  CHECK_THROWS_AS(tok.encode("to be @ not"), tg::InputError);
  try {
    tok.encode("to be @ not");
  } catch (const tg::InputError& e) {
    std::string msg = e.what();
    INFO("message: " << msg);
    CHECK(msg.find("'@'") != std::string::npos);
    CHECK(msg.find("position 6") != std::string::npos);
    CHECK(msg.find("expected") != std::string::npos);
  }
}

TEST_CASE("data: the vocabulary is the code points of UTF-8 text, as a Python str has them") {
  // Greek, accented Latin, Japanese, an emoji (4 bytes), no newline; 'é' twice
  const std::string text = "\xce\xb1\xce\xb2\xce\xb3 caf\xc3\xa9 \xc3\xa9t\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xf0\x9f\x98\x80";
  const data::CharTokenizer tok = data::CharTokenizer::from_text(text);
  // sorted(set("αβγ café été 日本😀")) in Python
  const std::vector<char32_t> want = {U' ', U'a', U'c', U'f', U't', 0xE9, 0x3B1, 0x3B2, 0x3B3, 0x65E5, 0x672C, 0x1F600};
  CHECK(tok.itos == want);
  const std::vector<int32_t> ids = tok.encode(text);
  CHECK(ids.size() == 16);  // characters, not bytes (text.size() is 29)
  CHECK(text.size() == 29);
  CHECK(ids[0] == 6);       // α
  CHECK(ids.back() == 11);  // 😀
  CHECK(tok.decode(ids.data(), ids.size()) == text);
  CHECK(data::CharTokenizer::from_chars(tok.chars()).itos == tok.itos);
  CHECK(tok.default_prompt() == " ");  // no newline in the text: its first character
  CHECK(data::CharTokenizer::from_text("ab\n").default_prompt() == "\n");
  // a character outside the vocabulary is named with its position and byte offset
  try {
    tok.encode("\xce\xb1x");
    FAIL("no error");
  } catch (const tg::InputError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("'x' (U+0078) at position 1 (byte offset 2)") != std::string::npos);
  }
  // invalid UTF-8 is refused with the byte offset of the bad sequence, as Python's decoder
  const std::vector<std::pair<std::string, size_t>> bad = {
      {"ab\xff", 2},              // never in UTF-8
      {"ab\x80" "c", 2},            // a continuation byte alone
      {"ab\xc3", 2},              // cut short
      {"ab\xe6\x97", 2},          // cut short
      {"ab\xc3(", 2},             // a lead byte without its continuation
      {"\xc0\xaf", 0},            // overlong '/'
      {"x\xe0\x80\xaf", 1},       // overlong, 3 bytes
      {"x\xed\xa0\x80", 1},       // a surrogate, U+D800
      {"x\xf4\x90\x80\x80", 1},   // past U+10FFFF
      {"\xce\xb1\xce\xb2\xf5", 4},  // never in UTF-8, after two 2-byte characters
  };
  for (const auto& [s, at] : bad) {
    INFO(tg::printable(s));
    std::string msg;
    try {
      data::CharTokenizer::from_text(s);
    } catch (const tg::InputError& e) {
      msg = e.what();
    }
    INFO(msg);
    CHECK(msg.find("not valid UTF-8") != std::string::npos);
    CHECK(msg.find("at byte offset " + std::to_string(at) + " ") != std::string::npos);
    CHECK(msg.find("expected") != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);
  }
  // a stored vocabulary that is not one: refused
  for (const std::string& chars : {std::string(""), std::string("ba"), std::string("aa"), std::string("a\xff")})
    CHECK_THROWS_AS(data::CharTokenizer::from_chars(chars), tg::InputError);
}

TEST_CASE("data: load_dataset refuses a data file that is not UTF-8, naming the byte offset") {
  TempDir tmp;
  std::string text(100, 'a');
  text += "\nLatin-1: caf\xe9\n";  // é in Latin-1, at byte offset 113
  text += std::string(100, 'b');
  const std::string path = tmp.write("latin1.txt", text);
  check_load_error("Latin-1 text", path, 8, "not valid UTF-8");
  const std::string msg = load_error(path, 8);
  CHECK(msg.find("byte 0xe9 at byte offset 113 (line 2)") != std::string::npos);
  CHECK(msg.find("--data") != std::string::npos);
  // the same text in UTF-8 loads, é one token
  text.replace(113, 1, "\xc3\xa9");
  data::Dataset d = data::load_dataset(tmp.write("utf8.txt", text), 8);
  CHECK(d.train.size() + d.val.size() == text.size() - 1);
  CHECK(d.tok.id(0xE9) >= 0);
}

TEST_CASE("data: split sizes of tiny Shakespeare") {
  const data::Dataset& d = shakespeare();
  CHECK(d.path == data_path());
  CHECK(d.tok.vocab_size() == 65);
  CHECK(d.train.size() == 1003854);
  CHECK(d.val.size() == 111540);
  CHECK(d.train.size() + d.val.size() == 1115394);
  std::vector<int32_t> all = d.tok.encode(shakespeare_text());
  REQUIRE(all.size() == 1115394);
  CHECK(d.val[0] == all[1003854]);
  CHECK(std::equal(d.train.begin(), d.train.end(), all.begin()));
  CHECK(std::equal(d.val.begin(), d.val.end(), all.begin() + 1003854));

  // The floor of n * 0.9 and the block_size + 1 bound on a small file: "hello world\n" has
  // 12 tokens, so train 10 (int(10.8)) and val 2, enough for block_size 1 but not 2.
  TempDir tmp;
  std::string small = tmp.write("small.txt", "hello world\n");
  data::Dataset s = data::load_dataset(small, 1);
  CHECK(s.tok.vocab_size() == 9);  // \n ' ' d e h l o r w
  CHECK(s.train.size() == 10);
  CHECK(s.val.size() == 2);
  CHECK(s.tok.decode(s.val.data(), s.val.size()) == "d\n");
}

TEST_CASE("data: sha256 gives FIPS 180-4's digests, and tiny Shakespeare's published one") {
  auto sha = [](const std::string& s) { return data::sha256_hex(s.data(), s.size()); };
  CHECK(sha("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 56 bytes: the length no longer fits the first padding block
  CHECK(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu") ==
        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  CHECK(sha(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // lengths around the padding's block boundaries (digests from coreutils' sha256sum)
  const std::vector<std::pair<size_t, const char*>> edges = {
      {55, "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072"},
      {56, "04c26261370ee7541549d16dee320c723e3fd14671e66a099afe0a377c16888e"},
      {63, "75220b47218278e656f2013bb8f0c455a25eaf01e86c64924e9d48d89776d6f2"},
      {64, "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c"},
      {65, "9537c5fdf120482f7d58d25e9ed583f52c02b4e304ea814db1633ad565aed7e9"},
      {119, "000b48d4edf0fa7bee3c6236ecd2785baa5db4eeb8bb54341b029e0d9fa5fb0c"},
      {120, "13f05a0b594787f5ecd315edc96141bd3243203d1b7d4f0836f37308b276ba98"}};
  for (const auto& e : edges) {
    CAPTURE(e.first);
    CHECK(sha(std::string(e.first, 'x')) == e.second);
  }
  // the checksum data/get_tinyshakespeare.sh verifies, and load_dataset's
  CHECK(sha(shakespeare_text()) == "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed");
  CHECK(shakespeare().sha256 == sha(shakespeare_text()));
  // one changed byte changes it
  std::string t = shakespeare_text();
  std::swap(t[10], t[20]);
  CHECK(sha(t) != sha(shakespeare_text()));
}

TEST_CASE("data: train_batch windows") {
  const data::Dataset& d = shakespeare();
  const std::vector<int32_t>& tok = d.train;
  const int B = 6, T = 64;
  const uint64_t seed = 1337;
  Batch a = train(tok, seed, 0, B, T);

  // y is x shifted by one, and each window (x row + last y) is a run of the split.
  for (int b = 0; b < B; ++b) {
    const int32_t* xr = &a.x[(size_t)b * T];
    const int32_t* yr = &a.y[(size_t)b * T];
    for (int t = 0; t + 1 < T; ++t) CHECK(xr[t + 1] == yr[t]);
    std::vector<int32_t> w(xr, xr + T);
    w.push_back(yr[T - 1]);
    auto it = std::search(tok.begin(), tok.end(), w.begin(), w.end());
    INFO("window " << b);
    CHECK(it != tok.end());
  }

  // A pure function of (seed, step).
  CHECK(train(tok, seed, 0, B, T) == a);
  CHECK(train(tok, seed, 7, B, T) == train(tok, seed, 7, B, T));
  CHECK(!(train(tok, seed, 1, B, T) == a));
  CHECK(!(train(tok, seed + 1, 0, B, T) == a));
  CHECK(!(train(tok, seed | (1ull << 40), 0, B, T) == a));  // the seed's high word counts too

  // Starts follow the documented formula exactly and spread over the split.
  const size_t n = tok.size();
  std::vector<int32_t> idx = iota_tokens(n);
  int32_t lo = (int32_t)n, hi = -1;
  const int BB = 20;
  for (uint32_t step = 0; step < 100; ++step) {
    Batch c = train(idx, seed, step, BB, 8);
    for (int b = 0; b < BB; ++b) {
      int32_t s = c.x[(size_t)b * 8];
      philox::U32x4 r = philox::stream_words(seed, philox::kStreamBatch, (uint32_t)b, step, 0);
      CHECK(s == (int32_t)philox::uniform_below(r.v[0], (uint32_t)(n - 8)));
      CHECK(c.y[(size_t)b * 8 + 7] == s + 8);
      lo = std::min(lo, s);
      hi = std::max(hi, s);
    }
  }
  INFO("2000 starts in [" << lo << ", " << hi << "] of n = " << n);
  CHECK(lo < 0.05 * n);
  CHECK(hi > 0.95 * n);

  // The last possible start: n = T + 2 tokens leave starts {0, 1}; both occur, and nothing
  // is read past the end.
  const int Ts = 5;
  std::vector<int32_t> tiny = iota_tokens(Ts + 2);
  Batch e = train(tiny, seed, 3, 64, Ts);
  bool saw[2] = {false, false};
  for (int b = 0; b < 64; ++b) {
    int32_t s = e.x[(size_t)b * Ts];
    REQUIRE((s == 0 || s == 1));
    saw[s] = true;
    for (int t = 0; t < Ts; ++t) {
      CHECK(e.x[(size_t)b * Ts + t] == s + t);
      CHECK(e.y[(size_t)b * Ts + t] == s + t + 1);
    }
  }
  CHECK(saw[0]);
  CHECK(saw[1]);

  // Too short a split for one window of T + 1.
  CHECK_THROWS_AS(train(iota_tokens(Ts), seed, 0, 1, Ts), tg::InputError);
}

TEST_CASE("data: eval_batch fixed set") {
  const data::Dataset& d = shakespeare();
  const int B = 4, T = 32;
  const uint64_t seed = 1337;
  Batch v0 = eval(d.val, seed, 1, 0, B, T);
  CHECK(eval(d.val, seed, 1, 0, B, T) == v0);
  CHECK(!(eval(d.val, seed, 1, 1, B, T) == v0));
  CHECK(!(eval(d.train, seed, 0, 0, B, T) == v0));
  for (int b = 0; b < B; ++b)
    for (int t = 0; t + 1 < T; ++t) CHECK(v0.x[(size_t)b * T + t + 1] == v0.y[(size_t)b * T + t]);

  // On the same tokens, the split index alone changes the windows, and an eval batch is not
  // a training batch of the same number.
  std::vector<int32_t> idx = iota_tokens(d.train.size());
  Batch s0 = eval(idx, seed, 0, 2, B, T), s1 = eval(idx, seed, 1, 2, B, T);
  CHECK(!(s0 == s1));
  CHECK(!(s0 == train(idx, seed, 2, B, T)));
  for (int b = 0; b < B; ++b) {
    philox::U32x4 r = philox::stream_words(seed, philox::kStreamEval, (uint32_t)b, 2, 1);
    CHECK(s1.x[(size_t)b * T] == (int32_t)philox::uniform_below(r.v[0], (uint32_t)(idx.size() - T)));
  }
}

TEST_CASE("data: load_dataset errors") {
  TempDir tmp;
  check_load_error("missing file", tmp.dir + "/no_such_file.txt", 8, "does not exist");
  CHECK(load_error(tmp.dir + "/no_such_file.txt", 8).find("make data") != std::string::npos);

  std::string sub = tmp.dir + "/sub";
  REQUIRE(mkdir(sub.c_str(), 0700) == 0);
  check_load_error("a directory", sub, 8, "is a directory");

  check_load_error("empty file", tmp.write("empty.txt", ""), 8, "is empty");

  // 40 tokens: train 36, val 4; block_size 8 needs 9 in each.
  std::string short_path = tmp.write("short.txt", std::string(40, 'a'));
  check_load_error("too-short file", short_path, 8, "too short");
  std::string msg = load_error(short_path, 8);
  CHECK(msg.find("36 tokens") != std::string::npos);     // what it has
  CHECK(msg.find("val split 4") != std::string::npos);
  CHECK(msg.find("at least 9") != std::string::npos);    // what it needs
  CHECK(load_error(short_path, 3).empty());    // 4 >= 3 + 1: fits
}

// Root reads a chmod 000 file, so as root this case is skipped (and counted as skipped).
TEST_CASE("data: load_dataset refuses an unreadable file" * doctest::skip(geteuid() == 0)) {
  TempDir tmp;
  std::string locked = tmp.write("locked.txt", std::string(1000, 'a'));
  REQUIRE(chmod(locked.c_str(), 0) == 0);
  check_load_error("unreadable file", locked, 8, "cannot be read");
}
