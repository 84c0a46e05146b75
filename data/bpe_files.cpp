// data/bpe_files.cpp: the readers of byte-level BPE tokenizer files: Hugging Face's vocab.json +
// merges.txt and tokenizer.json, tiktoken's rank files (formats and rules in data/bpe.h).
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>

#include "data/bpe.h"
#include "data/errors.h"
#include "data/tokens.h"

namespace data {

namespace fs = std::filesystem;

namespace {

using tg::bad_input;

constexpr size_t kMaxFileBytes = size_t(1) << 30;
constexpr size_t kMaxVocab = size_t(1) << 22;
constexpr size_t kMaxTokenBytes = 1024;  // GPT-2's longest is 128 bytes
const char* const kEot = "<|endoftext|>";

std::string read_file(const std::string& path, const std::string& what) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    bad_input("cannot read " + what + " " + path + "; expected a readable file; check --tokenizer");
  if ((uint64_t)st.st_size > kMaxFileBytes)
    bad_input(what + " " + path + " is " + std::to_string(st.st_size) + " bytes; expected at most 1 GiB; check --tokenizer");
  std::ifstream in(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) bad_input("cannot read " + what + " " + path + "; check the file");
  return s;
}

// GPT-2's byte-to-unicode alphabet: the code point that stands for each byte, and back.
struct ByteAlphabet {
  char32_t of_byte[256];
  int16_t byte_of[324];  // code point -> byte, -1 when none
  ByteAlphabet() {
    std::fill(byte_of, byte_of + 324, (int16_t)-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      of_byte[b] = self ? (char32_t)b : (char32_t)(256 + extra++);
      byte_of[of_byte[b]] = (int16_t)b;
    }
  }
};
const ByteAlphabet kAlphabet;

// The bytes a vocabulary key in GPT-2's alphabet stands for; false when a character is outside
// the alphabet or the key is not UTF-8.
bool key_bytes(const std::string& key, std::string& out) {
  out.clear();
  const unsigned char* p = reinterpret_cast<const unsigned char*>(key.data());
  for (size_t i = 0; i < key.size();) {
    char32_t cp;
    size_t len;
    if (p[i] < 0x80) { cp = p[i]; len = 1; }
    else if ((p[i] & 0xE0) == 0xC0 && i + 1 < key.size() && (p[i + 1] & 0xC0) == 0x80) {
      cp = (char32_t)(p[i] & 0x1F) << 6 | (p[i + 1] & 0x3F);
      len = 2;
    } else {
      return false;
    }
    if (cp >= 324 || kAlphabet.byte_of[cp] < 0 || (len == 2 && cp < 0x80)) return false;
    out += (char)kAlphabet.byte_of[cp];
    i += len;
  }
  return true;
}

std::string fix_hf(const std::string&) {
  return "; pass a GPT-2 byte-level BPE (a Hugging Face GPT-2 directory, its vocab.json + merges.txt or "
         "tokenizer.json, or tiktoken's gpt2.tiktoken)";
}

// The vocabulary of a {"token": id} object: tokens_[id] = bytes.
void read_vocab(const nlohmann::json& v, const std::string& origin, std::vector<std::string>& tokens,
                std::unordered_map<std::string, int32_t>& ids, const std::vector<std::pair<int, std::string>>& added) {
  if (!v.is_object()) bad_input(origin + ": the vocabulary is not a JSON object; expected {\"token\": id, ...}" + fix_hf(origin));
  if (v.size() == 0 || v.size() > kMaxVocab)
    bad_input(origin + ": the vocabulary holds " + std::to_string(v.size()) + " tokens; expected 256 to " +
        std::to_string(kMaxVocab) + fix_hf(origin));
  std::vector<char> seen(v.size() + added.size(), 0);
  tokens.assign(v.size(), std::string());
  std::string bytes;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it.value().is_number_integer())
      bad_input(origin + ": token \"" + tg::printable(it.key()) + "\" has id " + tg::printable(it.value().dump()) +
          "; expected an integer id" + fix_hf(origin));
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= (int64_t)v.size())
      bad_input(origin + ": token \"" + tg::printable(it.key()) + "\" has id " + std::to_string(id) + "; expected ids 0 to " +
          std::to_string(v.size() - 1) + " (one per token)" + fix_hf(origin));
    if (seen[(size_t)id]) bad_input(origin + ": id " + std::to_string(id) + " is given to two tokens; expected each id once" + fix_hf(origin));
    seen[(size_t)id] = 1;
    bool special = false;
    for (const auto& a : added) special |= a.first == id && a.second == it.key();
    if (special) {
      bytes = it.key();
    } else if (!key_bytes(it.key(), bytes)) {
      bad_input(origin + ": token \"" + tg::printable(it.key()) + "\" (id " + std::to_string(id) +
          ") has a character outside GPT-2's byte-to-unicode alphabet; expected a byte-level BPE vocabulary" + fix_hf(origin));
    }
    tokens[(size_t)id] = bytes;
    ids.emplace(it.key(), (int32_t)id);
  }
}

// Merge number rank: a b -> the token a+b.
void add_merge(std::unordered_map<uint64_t, std::pair<uint32_t, int32_t>>& pairs,
               const std::unordered_map<std::string, int32_t>& ids, const std::vector<std::string>& tokens,
               const std::string& a, const std::string& b, uint32_t rank, const std::string& where,
               const std::string& origin) {
  auto ia = ids.find(a), ib = ids.find(b), ic = ids.find(a + b);
  const auto& missing = ia == ids.end() ? a : ib == ids.end() ? b : a + b;
  if (ia == ids.end() || ib == ids.end() || ic == ids.end())
    bad_input(origin + ": " + where + " merges \"" + tg::printable(a) + "\" and \"" + tg::printable(b) + "\" but the vocabulary lacks \"" +
        tg::printable(missing) + "\"; expected merges of the vocabulary's tokens into one of its tokens; the merges "
        "and the vocabulary are not of one tokenizer: pass both from the same directory");
  if (tokens[(size_t)ic->second] != tokens[(size_t)ia->second] + tokens[(size_t)ib->second])
    bad_input(origin + ": " + where + " merges \"" + tg::printable(a) + "\" and \"" + tg::printable(b) +
        "\" into a token whose bytes are not theirs (an added token's content); expected byte-level merges" + fix_hf(origin));
  const uint64_t key = (uint64_t)(uint32_t)ia->second << 32 | (uint32_t)ib->second;
  if (!pairs.emplace(key, std::make_pair(rank, ic->second)).second)
    bad_input(origin + ": " + where + " repeats the merge \"" + tg::printable(a) + " " + tg::printable(b) +
        "\"; expected each merge once" + fix_hf(origin));
}

int32_t eot_of(const std::unordered_map<std::string, int32_t>& ids) {
  auto it = ids.find(kEot);
  return it == ids.end() ? -1 : it->second;
}

// Calls f(line, s) for each line of text that is not empty (1-based line numbers, a trailing '\r'
// dropped): the line loop of merges.txt and of tiktoken's rank files.
template <typename F>
void for_each_line(const std::string& text, F&& f) {
  size_t line = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string s = text.substr(at, end - at);
    at = end + 1;
    ++line;
    if (!s.empty() && s.back() == '\r') s.pop_back();
    if (!s.empty()) f(line, s);
  }
}

}  // namespace

// The readers, with access to BpeTokenizer's members.
struct BpeFiles {
  static BpeTokenizer from_vocab(const nlohmann::json& vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                                 const std::vector<std::string>& merge_where,
                                 const std::vector<std::pair<int, std::string>>& added, const std::string& origin) {
    BpeTokenizer t;
    t.origin_ = origin;
    t.ranks_ = BpeTokenizer::Ranks::Merges;
    std::unordered_map<std::string, int32_t> ids;
    read_vocab(vocab, origin, t.tokens_, ids, added);
    // added tokens beyond the vocabulary: their content
    for (const auto& a : added) {
      if (a.first < 0 || (size_t)a.first > kMaxVocab)
        bad_input(origin + ": added token \"" + tg::printable(a.second) + "\" has id " + std::to_string(a.first) +
            "; expected an id after the vocabulary's" + fix_hf(origin));
      if ((size_t)a.first < t.tokens_.size()) {
        if (ids.count(a.second) == 0 || ids.at(a.second) != a.first)
          bad_input(origin + ": added token \"" + tg::printable(a.second) + "\" has id " + std::to_string(a.first) +
              ", the id of another token; expected its vocabulary id or a new one" + fix_hf(origin));
        continue;
      }
      if ((size_t)a.first != t.tokens_.size())
        bad_input(origin + ": added token \"" + tg::printable(a.second) + "\" has id " + std::to_string(a.first) +
            "; expected the next free id " + std::to_string(t.tokens_.size()) + fix_hf(origin));
      t.tokens_.push_back(a.second);
      ids.emplace(a.second, a.first);
    }
    std::unordered_map<uint64_t, std::pair<uint32_t, int32_t>> pairs;
    for (size_t r = 0; r < merges.size(); ++r)
      add_merge(pairs, ids, t.tokens_, merges[r].first, merges[r].second, (uint32_t)r, merge_where[r], origin);
    for (const auto& [k, v] : pairs) t.pairs_.emplace(k, BpeTokenizer::PairRank{v.first, v.second});
    t.eot_ = eot_of(ids);
    t.specials_.clear();
    if (t.eot_ >= 0) t.specials_.push_back(t.eot_);
    for (const auto& a : added) t.specials_.push_back(a.first);
    t.finish();
    return t;
  }
};

BpeTokenizer BpeTokenizer::from_vocab_merges(const std::string& vocab_json, const std::string& merges_txt,
                                             const std::string& origin) {
  nlohmann::json v;
  try {
    v = nlohmann::json::parse(vocab_json);
  } catch (const nlohmann::json::exception& e) {
    bad_input(origin + ": vocab.json is not JSON (" + tg::printable(e.what(), 100) + "); expected {\"token\": id, ...}" + fix_hf(origin));
  }
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::string> where;
  for_each_line(merges_txt, [&](size_t line, const std::string& s) {
    if (s.rfind("#version", 0) == 0 && merges.empty()) return;
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos)
      bad_input(origin + ": merges.txt line " + std::to_string(line) + " is \"" + tg::printable(s) +
          "\"; expected two tokens separated by one space" + fix_hf(origin));
    merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    where.push_back("merges.txt line " + std::to_string(line));
  });
  BpeTokenizer t = BpeFiles::from_vocab(v, merges, where, {}, origin);
  t.files_ = {{"vocab.json", vocab_json}, {"merges.txt", merges_txt}};
  return t;
}

BpeTokenizer BpeTokenizer::from_tokenizer_json(const std::string& json, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    bad_input(origin + " is not JSON (" + tg::printable(e.what(), 100) + "); expected Hugging Face's tokenizer.json" + fix_hf(origin));
  }
  // (a field of another JSON type than the one read throws nlohmann's type_error: a refusal too)
  try {
    auto shape = [&](bool ok, const std::string& what) {
      if (!ok)
        bad_input(origin + ": " + what + "; expected GPT-2's shape: a BPE model, a ByteLevel pre-tokenizer without prefix "
            "space, no normalizer" + fix_hf(origin));
    };
    shape(j.is_object() && j.contains("model") && j["model"].is_object(), "no \"model\" object");
    const nlohmann::json& m = j["model"];
    shape(m.value("type", std::string("BPE")) == "BPE", "the model is not BPE");
    auto null_or = [&](const char* key, const nlohmann::json& ok) {
      return !m.contains(key) || m[key].is_null() || m[key] == ok;
    };
    shape(null_or("dropout", 0.0) && null_or("continuing_subword_prefix", "") && null_or("end_of_word_suffix", "") &&
              null_or("byte_fallback", false) && null_or("ignore_merges", false),
          "the BPE model has dropout, a subword prefix or suffix, byte fallback or ignore_merges");
    shape(!j.contains("normalizer") || j["normalizer"].is_null(), "it has a normalizer");
    const nlohmann::json pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json();
    shape(pre.is_object() && pre.value("type", std::string()) == "ByteLevel", "the pre-tokenizer is not ByteLevel");
    shape(pre.value("add_prefix_space", false) == false && pre.value("use_regex", true) == true,
          "the ByteLevel pre-tokenizer adds a prefix space or does not use GPT-2's pattern");
    shape(m.contains("vocab") && m.contains("merges") && m["merges"].is_array(),
          "the model has no vocab or no merges list");
    std::vector<std::pair<int, std::string>> added;
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      shape(j["added_tokens"].is_array(), "added_tokens is not a list");
      for (const auto& a : j["added_tokens"]) {
        shape(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a.contains("content") &&
                  a["content"].is_string(), "an added token has no integer id or no content");
        const int64_t id = a["id"].get<int64_t>();
        shape(id >= 0 && (uint64_t)id <= kMaxVocab, "an added token's id is out of range");
        added.emplace_back((int)id, a["content"].get<std::string>());
      }
    }
    std::vector<std::pair<std::string, std::string>> merges;
    std::vector<std::string> where;
    const auto& ml = m["merges"];
    for (size_t r = 0; r < ml.size(); ++r) {
      const auto& e = ml[r];
      where.push_back("merge " + std::to_string(r));
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos)
          bad_input(origin + ": merge " + std::to_string(r) + " is \"" + tg::printable(s) +
              "\"; expected two tokens separated by one space" + fix_hf(origin));
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
      } else {
        bad_input(origin + ": merge " + std::to_string(r) + " is " + tg::printable(e.dump()) +
            "; expected \"a b\" or [\"a\", \"b\"]" + fix_hf(origin));
      }
    }
    BpeTokenizer t = BpeFiles::from_vocab(m["vocab"], merges, where, added, origin);
    t.files_ = {{"tokenizer.json", json}};
    return t;
  } catch (const nlohmann::json::exception& e) {
    bad_input(origin + ": a field of another type than GPT-2's (" + tg::printable(e.what(), 100) +
        "); expected GPT-2's shape: a BPE model, a ByteLevel pre-tokenizer without prefix space, no normalizer" +
        fix_hf(origin));
  }
}

BpeTokenizer BpeTokenizer::from_tiktoken(const std::string& text, const std::string& origin) {
  const std::string fix = "; expected per line a token in base64, a space and its rank, ranks 0 to n-1 (tiktoken's "
                          "gpt2.tiktoken / r50k_base.tiktoken); pass tiktoken's rank file";
  static const auto b64 = [] {
    std::array<int8_t, 256> d;
    d.fill(-1);
    const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) d[(unsigned char)a[i]] = (int8_t)i;
    return d;
  }();
  BpeTokenizer t;
  t.origin_ = origin;
  t.ranks_ = Ranks::Tiktoken;
  std::vector<std::pair<int64_t, std::string>> entries;
  for_each_line(text, [&](size_t line, const std::string& s) {
    auto refuse = [&](const std::string& why) {
      bad_input(origin + " line " + std::to_string(line) + " (\"" + tg::printable(s) + "\") " + why + fix);
    };
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == s.size()) refuse("is not \"base64 rank\"");
    const std::string enc = s.substr(0, sp), num = s.substr(sp + 1);
    if (enc.size() % 4 != 0) refuse("has a base64 token whose length is not a multiple of 4");
    std::string bytes;
    for (size_t i = 0; i < enc.size(); i += 4) {
      int v[4];
      for (int k = 0; k < 4; ++k) {
        const unsigned char ch = (unsigned char)enc[i + (size_t)k];
        v[k] = ch == '=' && i + 4 == enc.size() && k >= 2 ? -2 : b64[ch];
        if (v[k] == -1) refuse("has a character that is not base64");
      }
      if (v[2] == -2 && v[3] != -2) refuse("has a misplaced '='");
      bytes += (char)(v[0] << 2 | v[1] >> 4);
      if (v[2] != -2) bytes += (char)((v[1] & 15) << 4 | v[2] >> 2);
      if (v[3] != -2) bytes += (char)((v[2] & 3) << 6 | v[3]);
    }
    if (bytes.empty()) refuse("has an empty token");
    if (bytes.size() > kMaxTokenBytes) refuse("has a token of " + std::to_string(bytes.size()) + " bytes, past " + std::to_string(kMaxTokenBytes));
    if (num.size() > 9 || num.find_first_not_of("0123456789") != std::string::npos) refuse("has a rank that is not a number below 10^9");
    entries.emplace_back(std::stoll(num), bytes);
    if (entries.size() > kMaxVocab) refuse("is past " + std::to_string(kMaxVocab) + " tokens");
  });
  if (entries.empty()) bad_input(origin + " holds no token; expected one line per token" + fix);
  t.tokens_.assign(entries.size(), std::string());
  std::vector<char> seen(entries.size(), 0);
  for (const auto& [rank, bytes] : entries) {
    if (rank < 0 || rank >= (int64_t)entries.size() || seen[(size_t)rank])
      bad_input(origin + ": rank " + std::to_string(rank) + (rank < (int64_t)entries.size() ? " is given twice" : " is past the end") +
          "; expected ranks 0 to " + std::to_string(entries.size() - 1) + ", each once" + fix);
    seen[(size_t)rank] = 1;
    t.tokens_[(size_t)rank] = bytes;
  }
  // the pairs: every split of a token into two tokens merges into it at its rank
  std::unordered_map<std::string_view, int32_t> ids;
  for (size_t i = 0; i < t.tokens_.size(); ++i)
    if (!ids.emplace(t.tokens_[i], (int32_t)i).second)
      bad_input(origin + ": the token \"" + tg::printable(t.tokens_[i]) + "\" has two ranks; expected each token once" + fix);
  for (size_t i = 0; i < t.tokens_.size(); ++i) {
    const std::string_view s = t.tokens_[i];
    for (size_t k = 1; k < s.size(); ++k) {
      auto a = ids.find(s.substr(0, k));
      if (a == ids.end()) continue;
      auto b = ids.find(s.substr(k));
      if (b == ids.end()) continue;
      t.pairs_.emplace((uint64_t)(uint32_t)a->second << 32 | (uint32_t)b->second, PairRank{(uint32_t)i, (int32_t)i});
    }
  }
  t.eot_ = (int)t.tokens_.size();
  t.tokens_.push_back(kEot);
  t.specials_ = {t.eot_};
  t.files_ = {{fs::path(origin).filename().string().empty() ? "ranks.tiktoken" : fs::path(origin).filename().string(), text}};
  if (t.files_[0].first.size() < 9 || t.files_[0].first.compare(t.files_[0].first.size() - 9, 9, ".tiktoken") != 0)
    t.files_[0].first += ".tiktoken";
  t.finish();
  return t;
}

BpeTokenizer BpeTokenizer::from_llmc(const std::string& bytes, const std::string& origin) {
  // Gpt2Tokenizer::load reads a path: the bytes go through a file only when they are not one
  const Gpt2Tokenizer g = Gpt2Tokenizer::parse(bytes, origin);
  BpeTokenizer t;
  t.origin_ = origin;
  t.decode_only_ = true;
  t.tokens_ = g.tokens;
  t.eot_ = g.eot >= 0 ? g.eot : (t.tokens_.size() > (size_t)kGpt2Vocab - 1 && t.tokens_[kGpt2Vocab - 1] == kEot ? kGpt2Vocab - 1 : -1);
  t.files_ = {{"gpt2_tokenizer.bin", bytes}};
  std::fill(t.byte_id_, t.byte_id_ + 256, -1);
  return t;
}

void BpeTokenizer::finish() {
  const std::string fix = "; expected a byte-level BPE (every one of the 256 bytes a token)";
  std::vector<char> special(tokens_.size(), 0);
  for (int s : specials_) special[(size_t)s] = 1;
  std::fill(byte_id_, byte_id_ + 256, -1);
  by_bytes_.clear();
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (special[i]) continue;
    if (tokens_[i].empty()) bad_input(origin_ + ": token " + std::to_string(i) + " is empty" + fix);
    if (!by_bytes_.emplace(tokens_[i], (int32_t)i).second)
      bad_input(origin_ + ": tokens " + std::to_string(by_bytes_[tokens_[i]]) + " and " + std::to_string(i) + " are both \"" +
          tg::printable(tokens_[i]) + "\"; expected each token once" + fix);
    if (tokens_[i].size() == 1) byte_id_[(unsigned char)tokens_[i][0]] = (int32_t)i;
  }
  for (int b = 0; b < 256; ++b)
    if (byte_id_[b] < 0)
      bad_input(origin_ + ": no token is the single byte " + std::to_string(b) + " (it cannot encode every text)" + fix);
  if (ranks_ == Ranks::Merges) by_bytes_.clear();  // the shortcut is tiktoken's alone
  size_t cap = 16;
  while (cap < 2 * pairs_.size() + 2) cap *= 2;
  pair_table_.assign(cap, PairSlot{});
  for (const auto& [key, value] : pairs_) {
    for (size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);; i = (i + 1) & (cap - 1))
      if (pair_table_[i].key == ~0ull) {
        pair_table_[i] = PairSlot{key, value};
        break;
      }
  }
  std::unordered_map<uint64_t, PairRank>().swap(pairs_);
}

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  const std::string none = "; expected a Hugging Face GPT-2 directory (tokenizer.json, or vocab.json + merges.txt), one of "
                           "those files, tiktoken's gpt2.tiktoken, or llm.c's gpt2_tokenizer.bin (decoding only); check --tokenizer";
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "tokenizer.json", ec)) return load((p / "tokenizer.json").string());
    if (fs::exists(p / "vocab.json", ec)) return load((p / "vocab.json").string());
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(p, ec))
      if (e.path().extension() == ".tiktoken" || e.path().extension() == ".bin") found.push_back(e.path().filename().string());
    std::sort(found.begin(), found.end());
    if (found.size() == 1) return load((p / found[0]).string());
    if (found.size() > 1)
      bad_input("--tokenizer " + path + " is a directory holding several tokenizer files (" + found[0] + ", " + found[1] +
          (found.size() > 2 ? ", ..." : "") + "); expected one; pass the file itself");
    bad_input("--tokenizer " + path + " is a directory without tokenizer.json or vocab.json" + none);
  }
  if (!fs::exists(p, ec)) bad_input("--tokenizer " + path + " does not exist" + none);
  const std::string name = p.filename().string();
  if (p.extension() == ".tiktoken") return from_tiktoken(read_file(path, "tiktoken rank file"), path);
  if (p.extension() == ".bin") return from_llmc(read_file(path, "llm.c tokenizer file"), path);
  if (name == "merges.txt") return load((p.parent_path() / "vocab.json").string());
  if (p.extension() == ".json") {
    const std::string text = read_file(path, "tokenizer file");
    const size_t brace = text.find_first_not_of(" \t\r\n");
    // tokenizer.json is an object with "model"; vocab.json maps tokens to ids
    if (name == "tokenizer.json" || (name != "vocab.json" && brace != std::string::npos &&
                                     text.find("\"model\"") != std::string::npos))
      return from_tokenizer_json(text, path);
    const fs::path merges = p.parent_path() / "merges.txt";
    if (!fs::exists(merges, ec))
      bad_input("--tokenizer " + path + " has no merges.txt beside it; expected vocab.json and merges.txt in one directory" + none);
    BpeTokenizer t = from_vocab_merges(text, read_file(merges.string(), "merges file"), path);
    return t;
  }
  bad_input("--tokenizer " + path + " is not a tokenizer file train_gpt reads (by its name)" + none);
}

}  // namespace data
