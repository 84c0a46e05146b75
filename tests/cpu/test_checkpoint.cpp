// tests/cpu/test_checkpoint.cpp: checkpoints (model/formats/checkpoint.h).
//   - CRC-32 against the IEEE check value;
//   - config_to_text / config_from_text round trip every field bit for bit (odd strings,
//     seed 2^64-1, denormals, -0.0), and reject malformed text;
//   - the safetensors bytes: header layout spelled out, read back (lm_head.weight == wte),
//     and a hand-written header in another JSON style read too;
//   - save -> load -> save gives byte-identical files;
//   - a table of damaged checkpoints, each an InputError of one line saying what it expected;
//     AdamW moments or weights that are not finite, or a negative v, written with checksums
//     right: refused naming the file and the element, and skipped by latest_checkpoint;
//   - latest_checkpoint (newest complete, .tmp ignored, falls back past a damaged one), keep,
//     re-saving a step;
//   - write_file_atomic failures leave the old file and no temp file (root-proof cases).
// Everything is written under a temp directory named with the pid, removed at the end.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "../../model/formats/checkpoint.h"
#include "../../model/run/config.h"
#include "../../data/errors.h"
#include "../../model/net/gpt.h"
#include "test_util.h"

using namespace tg;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / ("tg_test_checkpoint_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), (std::streamsize)bytes.size());
  REQUIRE(f.good());
}

Config small_config(int n_embd = 16, int n_layer = 2) {
  Config c;
  apply_preset(c, "baby");
  c.n_layer = n_layer;
  c.n_head = 2;
  c.n_embd = n_embd;
  c.block_size = 8;
  c.bias = true;
  c.out_dir = "out/test";
  c.seed = 4242;
  return c;
}

ModelConfig model_of(const Config& c, int vocab = 11) {
  ModelConfig m;
  m.vocab_size = vocab;
  m.block_size = c.block_size;
  m.n_layer = c.n_layer;
  m.n_head = c.n_head;
  m.n_embd = c.n_embd;
  m.bias = c.bias;
  return m;
}

ckpt::Checkpoint random_checkpoint(const Config& c, const std::vector<ParamSpec>& table, uint32_t step) {
  ckpt::Checkpoint k;
  size_t n = param_count(table);
  k.step = step;
  k.steps_done = step;
  k.config = c;
  k.params = testutil::random_vec<float>(n);
  k.m = testutil::random_vec<float>(n);
  k.v = testutil::random_vec<float>(n, 0.0, 1.0);
  k.seed = c.seed;
  k.losses = testutil::random_vec<double>(step % 7 + 3, 0.5, 4.5);
  k.bad_steps = step % 3;
  k.data_sha256 = std::string(64, 'a');
  k.data_path = "/data/input \n.txt";
  k.unlogged = {"{\"step\": " + std::to_string(step - 1) + ", \"train_loss\": null}", "{}"};
  // 11 characters (the model's vocab_size), ascending: "\n !axz" é α 日 本 😀
  k.vocab = "\n !axz\xc3\xa9\xce\xb1\xe6\x97\xa5\xe6\x9c\xac\xf0\x9f\x98\x80";
  return k;
}

std::string step_dir(const std::string& out_dir, uint32_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "ckpt-%08u", step);
  return (fs::path(out_dir) / b).string();
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// The sections of a state.bin: tag, payload offset, payload length.
struct Section {
  std::string tag;
  size_t offset, length;
};

std::vector<Section> sections_of(const std::string& b) {
  std::vector<Section> out;
  size_t pos = 12;
  while (pos + 12 <= b.size()) {
    uint64_t len;
    std::memcpy(&len, b.data() + pos + 4, 8);
    out.push_back({b.substr(pos, 4), pos + 12, (size_t)len});
    pos += 12 + (size_t)len + 4;
  }
  return out;
}

// The message of the InputError f throws ("" and a failed check when it throws none).
std::string input_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("threw something else than InputError: " << e.what());
    return "";
  }
  FAIL_CHECK("no InputError thrown");
  return "";
}

void check_one_line_expected(const std::string& msg) {
  INFO(msg);
  CHECK(msg.find('\n') == std::string::npos);
  CHECK(msg.find("expected") != std::string::npos);
}

}  // namespace

TEST_CASE("checkpoint: crc32 is the IEEE CRC-32") {
  const std::string s = "123456789";
  CHECK(ckpt::crc32(s.data(), s.size()) == 0xCBF43926u);
  CHECK(ckpt::crc32("", 0) == 0u);
  CHECK(ckpt::crc32("a", 1) == 0xE8B7BE43u);
  CHECK(ckpt::crc32(s.data() + 4, 5, ckpt::crc32(s.data(), 4)) == 0xCBF43926u);  // continued
}

TEST_CASE("checkpoint: config_to_text / config_from_text round trip every field exactly") {
  Config a;
  a.preset = "shakespeare-char";
  a.data = std::string("dir with spaces/\xc3\xbc\xff\x01.txt");
  a.device = Device::Cpu;
  a.attention = Attention::Naive;
  a.precision = Precision::BF16;
  a.out_dir = "out/a=b%41%\r\n=";
  a.n_layer = 7; a.n_head = -3; a.n_embd = INT_MAX; a.block_size = INT_MIN;
  a.bias = true;
  a.dropout = 0.1;
  a.gelu = GeluForm::Erf;
  a.batch_size = 12345; a.grad_accum = 7; a.world = 3; a.zero = 1; a.max_iters = 0;
  a.lr = 1e-300; a.min_lr = std::numeric_limits<double>::denorm_min();
  a.warmup_iters = -1; a.lr_decay_iters = 99;
  a.weight_decay = std::nextafter(1.0, 2.0); a.beta1 = 1.0 / 3.0; a.beta2 = -0.0; a.grad_clip = 2.0 / 3.0;
  a.eval_interval = 3; a.eval_iters = 4; a.log_interval = 5;
  a.ckpt_interval = 8; a.resume = true;
  a.seed = UINT64_MAX;
  a.sample_tokens = 6;
  a.prompt = std::string("\n=%\0\x7f\x80 ROMEO:\n", 15);
  a.temperature = std::numeric_limits<double>::max();
  a.top_k = -7;
  a.top_p = 0.95;
  a.sample = true;
  a.ckpt = "out/x\n";
  a.export_hf = "hf dir";
  a.init_from = "gpt2/model.safetensors%";
  a.logits = "464,3290";

  std::string text = config_to_text(a);
  const char* names[] = {"preset", "data", "device", "attention", "precision", "out_dir", "n_layer", "n_head", "n_embd",
                         "block_size", "bias", "dropout", "gelu", "batch_size", "grad_accum", "world", "zero", "max_iters", "lr", "min_lr",
                         "warmup_iters", "lr_decay_iters", "weight_decay", "beta1", "beta2", "grad_clip",
                         "eval_interval", "eval_iters", "log_interval", "ckpt_interval", "resume", "seed", "sample_tokens", "prompt",
                         "temperature", "top_k", "top_p", "sample", "ckpt", "export_hf", "tokenizer", "init_from", "logits"};
  // one "name=value" line per field: strings with newlines did not add lines
  size_t lines = 0;
  for (char ch : text) lines += ch == '\n';
  CHECK(lines == sizeof names / sizeof names[0]);
  for (const char* n : names) {
    INFO(n);
    std::string key = std::string(n) + "=";
    CHECK((text.compare(0, key.size(), key) == 0 || text.find("\n" + key) != std::string::npos));
  }

  Config b = config_from_text(text);
  CHECK(b.preset == a.preset); CHECK(b.data == a.data); CHECK(b.device == a.device);
  CHECK(b.attention == a.attention); CHECK(b.precision == a.precision); CHECK(b.out_dir == a.out_dir);
  CHECK(b.n_layer == a.n_layer); CHECK(b.n_head == a.n_head); CHECK(b.n_embd == a.n_embd);
  CHECK(b.block_size == a.block_size); CHECK(b.bias == a.bias); CHECK(same_bits(b.dropout, a.dropout));
  CHECK(b.gelu == GeluForm::Erf);
  CHECK(b.batch_size == a.batch_size); CHECK(b.grad_accum == a.grad_accum); CHECK(b.world == a.world);
  CHECK(b.zero == a.zero);
  CHECK(b.max_iters == a.max_iters);
  CHECK(same_bits(b.lr, a.lr)); CHECK(same_bits(b.min_lr, a.min_lr));
  CHECK(b.warmup_iters == a.warmup_iters); CHECK(b.lr_decay_iters == a.lr_decay_iters);
  CHECK(same_bits(b.weight_decay, a.weight_decay)); CHECK(same_bits(b.beta1, a.beta1));
  CHECK(same_bits(b.beta2, a.beta2)); CHECK(same_bits(b.grad_clip, a.grad_clip));
  CHECK(b.eval_interval == a.eval_interval); CHECK(b.eval_iters == a.eval_iters);
  CHECK(b.log_interval == a.log_interval); CHECK(b.seed == a.seed);
  CHECK(b.ckpt_interval == a.ckpt_interval); CHECK(b.resume == a.resume);
  CHECK(b.sample_tokens == a.sample_tokens); CHECK(b.prompt == a.prompt);
  CHECK(same_bits(b.temperature, a.temperature)); CHECK(b.top_k == a.top_k);
  CHECK(same_bits(b.top_p, a.top_p));
  CHECK(b.sample == a.sample); CHECK(b.ckpt == a.ckpt); CHECK(b.export_hf == a.export_hf);
  CHECK(b.init_from == a.init_from); CHECK(b.logits == a.logits);
  CHECK(config_to_text(b) == text);

  // a config written before --gelu existed has no gelu line: it was the tanh form
  std::string older = text;
  const size_t g = older.find("\ngelu=erf\n");
  REQUIRE(g != std::string::npos);
  older.erase(g + 1, std::string("gelu=erf\n").size());
  CHECK(config_from_text(older).gelu == GeluForm::Tanh);
  // nor had one written before --init-from and --logits those lines: a run from a fresh init
  std::string before_init = text.substr(0, text.find("init_from="));
  REQUIRE(before_init.size() < text.size());
  CHECK(config_from_text(before_init).init_from.empty());
  CHECK(config_from_text(before_init).logits.empty());

  Config d = config_from_text(config_to_text(Config{}));  // defaults too
  CHECK(d.prompt == "\n");
  CHECK(d.seed == 1337);

  // malformed text: each an InputError of one line
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    size_t at = t.find(from);
    REQUIRE(at != std::string::npos);
    return t.replace(at, from.size(), to);
  };
  const std::vector<std::string> bad = {
      replace("n_layer=7\n", ""),                         // missing field
      replace("n_layer=7\n", "n_layer=7\nn_layer=7\n"),   // repeated
      replace("n_layer=7\n", "n_layer=7\nwhat=1\n"),      // unknown
      replace("n_layer=7\n", "n_layer=7x\n"),             // not an int
      replace("n_layer=7\n", "n_layer=99999999999\n"),    // out of int range
      replace("bias=true\n", "bias=1\n"),
      replace("seed=18446744073709551615\n", "seed=18446744073709551616\n"),
      replace("seed=18446744073709551615\n", "seed=-1\n"),
      replace("beta1=", "beta1=x"),
      replace("device=cpu\n", "device=%4\n"),              // bad escape
      replace("device=cpu\n", "device\n"),                  // no '='
      replace("attention=naive\n", "attention=fast\n"),    // not one of the flag's values
      replace("precision=bf16\n", "precision=BF16\n"),
      replace("gelu=erf\n", "gelu=\n"),
  };
  for (const std::string& t : bad) {
    INFO(t);
    check_one_line_expected(input_error([&] { config_from_text(t); }));
  }
}

TEST_CASE("checkpoint: a saved config's values are bounded, refused as their line is read; flag_value is config_to_text's") {
  // validate() takes strings of up to kMaxConfigString bytes, and each such config reads back:
  // written, a byte is at most 3 (%XX), so a value is at most kMaxConfigValue
  Config c = small_config();
  c.prompt = std::string(kMaxConfigString, '\x80');
  CHECK_NOTHROW(validate(c));
  const std::string text = config_to_text(c);
  std::string escaped;
  for (size_t i = 0; i < kMaxConfigString; ++i) escaped += "%80";
  CHECK(escaped.size() == kMaxConfigValue);
  CHECK(text.find("\nprompt=" + escaped + "\n") != std::string::npos);
  CHECK(config_from_text(text).prompt == c.prompt);
  // each flag's value as the text holds it
  for (const std::string& flag : flag_names()) {
    CAPTURE(flag);
    std::string field = flag;
    std::replace(field.begin(), field.end(), '-', '_');
    const size_t at = ("\n" + text).find("\n" + field + "=");
    REQUIRE(at != std::string::npos);
    const size_t from = at + field.size() + 1;
    CHECK(flag_value(c, flag) == text.substr(from, text.find('\n', from) - from));
  }
  CHECK(flag_value(c, "no-such-flag").empty());
  // one byte more: refused by validate(), naming the flag, whichever string it is
  c.prompt += 'x';
  std::string msg = input_error([&] { validate(c); });
  check_one_line_expected(msg);
  CHECK(msg.find("--prompt is 262145 bytes long") != std::string::npos);
  CHECK(msg.find("expected at most 262144 bytes") != std::string::npos);
  CHECK(msg.size() < 300);
  c.prompt = "\n";
  c.out_dir = std::string(kMaxConfigString + 1, 'o');
  msg = input_error([&] { validate(c); });
  check_one_line_expected(msg);
  CHECK(msg.find("--out-dir is 262145 bytes long") != std::string::npos);
  c.out_dir = "out/test";

  // config_from_text: a value of kMaxConfigValue bytes is read, one more is refused naming
  // the field, before anything else of the text is decoded
  const std::string plain = config_to_text(c);
  auto with_prompt = [&](const std::string& value) {
    std::string t = plain;
    const size_t at = t.find("\nprompt=") + 8;
    return t.replace(at, t.find('\n', at) - at, value);
  };
  CHECK(config_from_text(with_prompt(std::string(kMaxConfigValue, 'A'))).prompt.size() == kMaxConfigValue);
  msg = input_error([&] { config_from_text(with_prompt(std::string(kMaxConfigValue + 1, 'A'))); });
  check_one_line_expected(msg);
  CHECK(msg.find("the saved config has prompt= of 786433 bytes; expected a value of at most 786432 bytes") !=
        std::string::npos);
  // an unknown field is refused at its line, so a text of many short lines costs no more
  msg = input_error([&] { config_from_text("n_layer=1\nzz=1\n" + std::string(1 << 20, '\n')); });
  check_one_line_expected(msg);
  CHECK(msg.find("has an unknown field zz") != std::string::npos);

  // a state.bin holding a 60 MB value, its CRCs computed by the writer: refused naming the file
  ckpt::CheckpointInfo info;
  info.config = c;
  info.config.prompt = std::string(60000000, 'A');
  info.data_sha256 = std::string(64, 'a');
  info.data_path = "/data/input.txt";
  const float m = 0, v = 0;
  msg = input_error([&] { ckpt::parse_state_bytes(ckpt::state_bytes(info, &m, &v, 1, 0), "run/ckpt-00000002/state.bin"); });
  check_one_line_expected(msg);
  CHECK(msg.find("checkpoint file run/ckpt-00000002/state.bin: the saved config has prompt= of 60000000 bytes; "
                 "expected a value of at most 786432 bytes") != std::string::npos);
  CHECK(msg.size() < 400);
  // and its data path: one the OS can open (PATH_MAX bytes), not 60 MB echoed in a message
  info.config.prompt = "\n";
  info.data_path = "/" + std::string(60000000, 'd');
  msg = input_error([&] { ckpt::parse_state_bytes(ckpt::state_bytes(info, &m, &v, 1, 0), "run/ckpt-00000002/state.bin"); });
  check_one_line_expected(msg);
  CHECK(msg.find("has a 'DATA' section of 60000066 bytes; expected the data file's sha256 (64 hex digits), a newline "
                 "and its absolute path of at most 4096 bytes") != std::string::npos);
  CHECK(msg.size() < 400);
  info.data_path = "/" + std::string(4095, 'd');  // PATH_MAX bytes with the '/'
  CHECK(ckpt::parse_state_bytes(ckpt::state_bytes(info, &m, &v, 1, 0), "s").data_path.size() == 4096);
}

TEST_CASE("checkpoint: the safetensors header is JSON in the safetensors format; lm_head.weight equals wte") {
  TempDir tmp;
  Config c = small_config();
  std::vector<ParamSpec> table = param_table(model_of(c));
  const size_t n = param_count(table);
  std::vector<float> params = testutil::random_vec<float>(n);
  const std::string meta = "n_layer=2 \"quoted\" back\\slash \xc3\xbc tab\t";
  std::string bytes = ckpt::safetensors_bytes(table, params.data(), meta);

  uint64_t hn;
  std::memcpy(&hn, bytes.data(), 8);
  REQUIRE(hn + 8 <= bytes.size());
  std::string header = bytes.substr(8, hn);
  CHECK(hn % 8 == 0);
  CHECK(header.front() == '{');
  size_t close = header.find_last_of('}');
  CHECK(header.find_first_not_of(' ', close + 1) == std::string::npos);  // padded with spaces
  CHECK(header.find("{\"__metadata__\":{\"format\":\"pt\",\"train_gpt_config\":\"n_layer=2 \\\"quoted\\\" back\\\\slash") == 0);
  const ParamSpec& wte = table[0];
  REQUIRE(wte.name == "transformer.wte.weight");
  CHECK(bytes.size() == 8 + hn + 4 * (n + wte.numel));
  // every entry spelled out, in table order, contiguous, lm_head.weight last
  size_t off = 0, last_pos = 0;
  auto entry = [&](const std::string& name, const std::vector<int>& shape, size_t numel) {
    std::string s = "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
    s += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + 4 * numel) + "]}";
    off += 4 * numel;
    INFO(s);
    size_t pos = header.find(s);
    CHECK(pos != std::string::npos);
    CHECK(pos > last_pos);
    last_pos = pos;
  };
  for (const ParamSpec& p : table) entry(p.name, p.shape, p.numel);
  entry("lm_head.weight", wte.shape, wte.numel);
  CHECK(header.find("transformer.h.1.mlp.c_proj.bias") != std::string::npos);

  // read back with lm_head.weight as one more expected tensor, after the model's
  std::string path = tmp / "model.safetensors";
  write_bytes(path, bytes);
  std::vector<ParamSpec> with_head = table;
  ParamSpec head = wte;
  head.name = "lm_head.weight";
  head.offset = n;
  with_head.push_back(head);
  std::vector<float> back = ckpt::read_safetensors(path, with_head);
  REQUIRE(back.size() == n + wte.numel);
  CHECK(same_bits(std::vector<float>(back.begin(), back.begin() + n), params));
  CHECK(same_bits(std::vector<float>(back.begin() + n, back.end()),
                  std::vector<float>(params.begin() + wte.offset, params.begin() + wte.offset + wte.numel)));
  CHECK(same_bits(ckpt::read_safetensors(path, table), params));

  // another writer's style: pretty-printed, keys in another order, metadata last, \u escapes
  ModelConfig tiny;
  tiny.vocab_size = 2; tiny.block_size = 1; tiny.n_layer = 0; tiny.n_head = 1; tiny.n_embd = 2;
  std::vector<ParamSpec> t2 = param_table(tiny);  // wte [2,2], wpe [1,2], ln_f.weight [2]
  REQUIRE(t2.size() == 3);
  std::string h2 =
      "{\n  \"transformer.ln_f.weight\": {\"data_offsets\": [0, 8], \"shape\": [2], \"dtype\": \"F32\"},\n"
      "  \"transformer.wp\\u0065.weight\": {\"shape\": [1, 2], \"dtype\": \"F32\", \"data_offsets\": [8, 16]},\n"
      "  \"transformer.wte.weight\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [16, 32]},\n"
      "  \"__metadata__\": {\"format\": \"pt\", \"note\": \"\\u00fc\\ud83d\\ude00\\n\"}\n}\n";
  std::string f2(8, '\0');
  uint64_t n2 = h2.size();
  std::memcpy(&f2[0], &n2, 8);
  f2 += h2;
  const float data[8] = {1, 2, 3, 4, 5, 6, 7, 8};  // ln_f, wpe, wte in file order
  f2.append(reinterpret_cast<const char*>(data), sizeof data);
  write_bytes(tmp / "other.safetensors", f2);
  std::vector<float> got = ckpt::read_safetensors(tmp / "other.safetensors", t2);  // table order: wte, wpe, ln_f
  CHECK(got == std::vector<float>({5, 6, 7, 8, 3, 4, 1, 2}));
}

TEST_CASE("checkpoint: the safetensors reader bounds untrusted headers; the vocabulary is metadata, escaped to ASCII") {
  Config c = small_config();
  std::vector<ParamSpec> table = param_table(model_of(c));
  std::vector<float> params = testutil::random_vec<float>(param_count(table));
  const std::string vocab = "\n !axz\xc3\xa9\xce\xb1\xe6\x97\xa5\xe6\x9c\xac\xf0\x9f\x98\x80";
  const std::string bytes = ckpt::safetensors_bytes(table, params.data(), "n_layer=2", vocab);
  uint64_t hn;
  std::memcpy(&hn, bytes.data(), 8);
  const std::string header = bytes.substr(8, hn);
  // ASCII: é, α, 日, 本 as \u escapes, 😀 as a surrogate pair, the newline as \n
  CHECK(std::all_of(header.begin(), header.end(), [](char ch) { return ch >= 0x20 && ch < 0x7f; }));
  CHECK(header.find("\"train_gpt_vocab\":\"\\n !axz\\u00e9\\u03b1\\u65e5\\u672c\\ud83d\\ude00\"") != std::string::npos);
  const ckpt::StFile f = ckpt::parse_safetensors(bytes, "m");
  CHECK(f.metadata.at(ckpt::kVocabKey) == vocab);
  CHECK(f.metadata.at("train_gpt_config") == "n_layer=2");
  CHECK(ckpt::parse_safetensors(ckpt::safetensors_bytes(table, params.data(), "x"), "m").metadata.count(ckpt::kVocabKey) == 0);

  // a header alone (no tensors, no data): its file
  auto file = [](const std::string& h) {
    std::string b(8, '\0');
    const uint64_t n = h.size();
    std::memcpy(&b[0], &n, 8);
    return b + h;
  };
  std::string deep = "{\"__metadata__\":{\"x\":";
  for (int i = 0; i < 20; ++i) deep += "[";
  for (int i = 0; i < 20; ++i) deep += "]";
  deep += "}}";
  std::string many = "{";
  for (int i = 0; i <= 65536; ++i) many += (i ? ",\"t" : "\"t") + std::to_string(i) + "\":{}";
  many += "}";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {deep, "nesting deeper than 16 levels"},
      {std::string(1 << 20, '['), "nesting deeper than 16 levels"},  // a megabyte of '[': refused early
      {"{\"a\":{},\"a\":{}}", "duplicate key \"a\""},
      {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", "duplicate key \"k\""},
      {many, "more than 65536 entries"},
      {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", "non-negative integer"},
      {"{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", "non-negative integer"},
      {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", "data_offsets is not [begin, end]"},
      {"{\"w\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}", "non-negative integer"},
      {"{\"__metadata__\":{\"k\":1}}", "is not a string"},
      {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]} x", "invalid JSON at byte"},
      {"{\"a\":\"\xff\"}", "invalid JSON at byte"},  // not UTF-8
      {"[1,2]", "not a JSON object"},
      {"", "invalid JSON at byte"},
  };
  for (const auto& [h, says] : bad) {
    INFO(printable(h));
    const std::string msg = input_error([&] { ckpt::parse_safetensors(file(h), "crafted.safetensors"); });
    INFO(msg);
    check_one_line_expected(msg);
    CHECK(msg.find(says) != std::string::npos);
  }
  // nested 16 levels deep is parsed (then refused as no tensor entry): the limit is 16
  std::string sixteen = "{\"__metadata__\":{\"x\":";
  for (int i = 0; i < 14; ++i) sixteen += "[";
  for (int i = 0; i < 14; ++i) sixteen += "]";
  sixteen += "}}";
  const std::string msg = input_error([&] { ckpt::parse_safetensors(file(sixteen), "m"); });
  CHECK(msg.find("nesting") == std::string::npos);
  CHECK(msg.find("is not a string") != std::string::npos);
  // a header past 100 MB is refused by its length, before it is read
  std::string huge(8, '\0');
  const uint64_t n = (100u << 20) + 8;
  std::memcpy(&huge[0], &n, 8);
  CHECK(input_error([&] { ckpt::parse_safetensors(huge, "m"); }).find("implausible header length") != std::string::npos);
}

TEST_CASE("checkpoint: save -> load -> save gives byte-identical files") {
  TempDir tmp;
  Config c = small_config();
  c.prompt = std::string("\n=\xff", 3);
  std::vector<ParamSpec> table = param_table(model_of(c));
  ckpt::Checkpoint a = random_checkpoint(c, table, 123);
  a.steps_done = 120;
  a.seed = UINT64_MAX;
  const std::string out1 = tmp / "run1", out2 = tmp / "run2";
  ckpt::save_checkpoint(out1, a, table);
  const std::string dir1 = step_dir(out1, 123);
  CHECK(ckpt::latest_checkpoint(out1) == dir1);
  // nothing left but the two files
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir1)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>({"model.safetensors", "state.bin"}));
  CHECK(std::distance(fs::directory_iterator(out1), fs::directory_iterator()) == 1);

  ckpt::Checkpoint b = ckpt::load_checkpoint(dir1, table);
  CHECK(b.step == 123);
  CHECK(b.steps_done == 120);
  CHECK(b.bad_steps == a.bad_steps);
  CHECK(b.seed == UINT64_MAX);
  CHECK(b.data_sha256 == a.data_sha256);
  CHECK(b.data_path == a.data_path);
  CHECK(b.unlogged == a.unlogged);
  CHECK(b.vocab == a.vocab);
  CHECK(ckpt::checkpoint_info(dir1).vocab == a.vocab);
  CHECK(same_bits(b.params, a.params));
  CHECK(same_bits(b.m, a.m));
  CHECK(same_bits(b.v, a.v));
  CHECK(same_bits(b.losses, a.losses));
  CHECK(b.config.prompt == a.config.prompt);
  CHECK(config_to_text(b.config) == config_to_text(a.config));

  ckpt::save_checkpoint(out2, b, table);
  const std::string dir2 = step_dir(out2, 123);
  for (const char* f : {"model.safetensors", "state.bin"}) {
    INFO(f);
    std::string x = read_bytes(dir1 + "/" + f), y = read_bytes(dir2 + "/" + f);
    CHECK(x.size() > 0);
    CHECK(x == y);
  }
}

TEST_CASE("checkpoint: a format-1 state.bin (no data, no NaN count, no unwritten lines) is still read") {
  TempDir tmp;
  Config c = small_config();
  std::vector<ParamSpec> table = param_table(model_of(c));
  ckpt::Checkpoint a = random_checkpoint(c, table, 10);
  const std::string out = tmp / "run";
  ckpt::save_checkpoint(out, a, table);
  const std::string dir = step_dir(out, 10), state = read_bytes(dir + "/state.bin");
  // format 1 as train_gpt wrote it: STEP of 8 bytes, no DATA or MTRC section
  std::string v1 = state.substr(0, 8);
  const uint32_t one = 1;
  v1.append(reinterpret_cast<const char*>(&one), 4);
  for (const Section& sec : sections_of(state)) {
    if (sec.tag == "DATA" || sec.tag == "MTRC") continue;
    const std::string payload = state.substr(sec.offset, sec.tag == "STEP" ? 8 : sec.length);
    const uint64_t len = payload.size();
    const uint32_t crc = ckpt::crc32(payload.data(), payload.size());
    v1 += sec.tag;
    v1.append(reinterpret_cast<const char*>(&len), 8);
    v1 += payload;
    v1.append(reinterpret_cast<const char*>(&crc), 4);
  }
  write_bytes(dir + "/state.bin", v1);
  CHECK(ckpt::checkpoint_damage(dir) == "");
  ckpt::Checkpoint b = ckpt::load_checkpoint(dir, table);
  CHECK(b.step == 10);
  CHECK(b.bad_steps == 0);
  CHECK(b.data_sha256.empty());
  CHECK(b.unlogged.empty());
  CHECK(same_bits(b.m, a.m));
  // format 2 must have them
  std::string no_data = state;
  no_data.replace(state.find("DATA"), 4, "XXXX");
  write_bytes(dir + "/state.bin", no_data);
  CHECK(ckpt::checkpoint_damage(dir).find("has no 'DATA' section") != std::string::npos);
}

TEST_CASE("checkpoint: damaged checkpoints throw a one-line InputError saying what was expected") {
  TempDir tmp;
  Config c = small_config();
  std::vector<ParamSpec> table = param_table(model_of(c));
  ckpt::save_checkpoint(tmp / "good", random_checkpoint(c, table, 10), table);
  ckpt::save_checkpoint(tmp / "other_run", random_checkpoint(c, table, 10), table);  // same model
  Config wide = small_config(32);
  std::vector<ParamSpec> wide_table = param_table(model_of(wide));
  ckpt::save_checkpoint(tmp / "wide", random_checkpoint(wide, wide_table, 10), wide_table);
  Config deep = small_config(16, 3);
  std::vector<ParamSpec> deep_table = param_table(model_of(deep));
  ckpt::save_checkpoint(tmp / "deep", random_checkpoint(deep, deep_table, 10), deep_table);

  const std::string good = step_dir(tmp / "good", 10);
  CHECK_NOTHROW(ckpt::load_checkpoint(good, table));
  const std::string state = read_bytes(good + "/state.bin"), weights = read_bytes(good + "/model.safetensors");
  const std::vector<Section> secs = sections_of(state);
  REQUIRE(secs.size() == 8);
  uint64_t hn;
  std::memcpy(&hn, weights.data(), 8);

  struct Case {
    std::string name;
    std::function<void(const std::string& dir)> damage;  // applied to a copy of good
    std::string keyword;                                // the message must contain it
    bool files_intact;  // both files read back (another model): latest_checkpoint still takes it
  };
  std::vector<Case> cases;
  auto state_as = [](std::string s) { return [s](const std::string& d) { write_bytes(d + "/state.bin", s); }; };
  auto weights_as = [](std::string s) { return [s](const std::string& d) { write_bytes(d + "/model.safetensors", s); }; };
  for (size_t len : {(size_t)0, (size_t)7, (size_t)12, state.size() / 2, state.size() - 1})
    cases.push_back({"state.bin truncated to " + std::to_string(len), state_as(state.substr(0, len)), "truncated", false});
  cases.push_back({"state.bin without its LOSS section", state_as(state.substr(0, secs[5].offset - 12)),
                   "no 'LOSS' section", false});
  for (size_t len : {(size_t)0, (size_t)7, (size_t)(8 + hn / 2), weights.size() / 2, weights.size() - 1})
    cases.push_back({"model.safetensors truncated to " + std::to_string(len), weights_as(weights.substr(0, len)),
                     "truncated", false});
  for (const Section& s : secs) {
    std::string b = state;
    b[s.offset + s.length / 2] ^= 0x10;
    cases.push_back({"flipped byte in section " + s.tag, state_as(b), "corrupted", false});
  }
  {
    std::string b = state;
    b[8] = (char)(ckpt::kFormatVersion + 1);
    cases.push_back({"newer format version", state_as(b), "newer train_gpt", false});
    b = state;
    b[0] = 'X';
    cases.push_back({"bad magic", state_as(b), "TGSTATE", false});
    b = weights;
    b[weights.size() - 3] ^= 0x01;
    cases.push_back({"flipped byte in the weights", weights_as(b), "not the weights file", false});
    b = weights;
    b[8 + 1] = '?';  // {"__metadata__" -> {?__metadata__"
    cases.push_back({"bad header JSON", weights_as(b), "bad header", false});
  }
  cases.push_back({"state.bin paired with another run's model.safetensors",
                   weights_as(read_bytes(step_dir(tmp / "other_run", 10) + "/model.safetensors")),
                   "not the weights file", false});
  cases.push_back({"state.bin missing", [](const std::string& d) { fs::remove(d + "/state.bin"); }, "does not exist", false});
  cases.push_back({"model.safetensors missing", [](const std::string& d) { fs::remove(d + "/model.safetensors"); },
                   "does not exist", false});
  auto replace_dir = [](const std::string& from) {
    return [from](const std::string& d) {
      fs::remove_all(d);
      fs::copy(from, d, fs::copy_options::recursive);
    };
  };
  cases.push_back({"a checkpoint of another n_embd", replace_dir(step_dir(tmp / "wide", 10)),
                   "was written for another model: transformer.wte.weight has shape [11,32], expected [11,16]", true});
  cases.push_back({"a checkpoint of another n_layer", replace_dir(step_dir(tmp / "deep", 10)),
                   "was written for another model: it has tensor transformer.h.2.", true});
  {
    // a config that does not describe the weights, with a valid CRC
    const Section& conf = secs[0];
    REQUIRE(conf.tag == "CONF");
    Config other = c;
    other.n_layer = 5;
    std::string text = config_to_text(other);
    std::string b = state.substr(0, conf.offset - 8);
    uint64_t len = text.size();
    b.append(reinterpret_cast<const char*>(&len), 8);
    b += text;
    uint32_t crc = ckpt::crc32(text.data(), text.size());
    b.append(reinterpret_cast<const char*>(&crc), 4);
    b += state.substr(conf.offset + conf.length + 4);
    cases.push_back({"a config that does not match the weights", state_as(b), "its config has n_layer 5", true});
  }

  int k = 0;
  for (const Case& cs : cases) {
    INFO(cs.name);
    const std::string out = tmp / ("case" + std::to_string(k++));
    const std::string dir = step_dir(out, 10);
    fs::create_directories(out);
    fs::copy(good, dir, fs::copy_options::recursive);
    cs.damage(dir);
    std::string msg = input_error([&] { ckpt::load_checkpoint(dir, table); });
    INFO(msg);
    check_one_line_expected(msg);
    CHECK(msg.find(cs.keyword) != std::string::npos);
    CHECK(ckpt::latest_checkpoint(out) == (cs.files_intact ? dir : ""));
  }
  // and read_safetensors alone, against another model's table
  std::string msg = input_error([&] { ckpt::read_safetensors(good + "/model.safetensors", wide_table); });
  check_one_line_expected(msg);
  CHECK(msg.find("pass the same --n-layer/--n-head/--n-embd/--block-size") != std::string::npos);
  // a dtype other than F32 (read_safetensors alone: in a checkpoint WSUM would object first)
  std::string f16 = weights;
  f16.replace(f16.find("\"F32\""), 5, "\"F16\"");
  write_bytes(tmp / "f16.safetensors", f16);
  msg = input_error([&] { ckpt::read_safetensors(tmp / "f16.safetensors", table); });
  check_one_line_expected(msg);
  CHECK(msg.find("transformer.wte.weight has dtype F16, expected F32") != std::string::npos);
}

TEST_CASE("checkpoint: AdamW moments or weights that are not finite, and a negative v, are refused naming the file and the element") {
  TempDir tmp;
  const Config c = small_config();
  const std::vector<ParamSpec> table = param_table(model_of(c));
  const ckpt::Checkpoint good = random_checkpoint(c, table, 6);
  const size_t n = good.m.size();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::string what;
    std::function<void(ckpt::Checkpoint&)> harm;
    std::string file, says;  // the file named, and what the message says of it
  };
  const size_t wpe = table[1].offset;
  REQUIRE(table[1].name == "transformer.wpe.weight");
  const std::vector<Case> cases = {
      {"m NaN", [](ckpt::Checkpoint& k) { k.m[3] = std::numeric_limits<float>::quiet_NaN(); }, "state.bin",
       "holds AdamW first moment m[3] = nan in its 'ADAM' section"},
      {"m -inf, the last element", [&](ckpt::Checkpoint& k) { k.m[n - 1] = -inf; }, "state.bin",
       "holds AdamW first moment m[" + std::to_string(n - 1) + "] = -inf"},
      {"v negative", [](ckpt::Checkpoint& k) { k.v[0] = -1; }, "state.bin", "holds AdamW second moment v[0] = -1 in its 'ADAM' section"},
      {"v the smallest negative float", [](ckpt::Checkpoint& k) { k.v[9] = -std::numeric_limits<float>::denorm_min(); },
       "state.bin", "holds AdamW second moment v[9] = -1.4013e-45"},
      {"v inf", [&](ckpt::Checkpoint& k) { k.v[7] = inf; }, "state.bin", "holds AdamW second moment v[7] = inf"},
      {"v NaN", [&](ckpt::Checkpoint& k) { k.v[n - 1] = nan; }, "state.bin", "holds AdamW second moment v[" + std::to_string(n - 1) + "] = nan"},
      {"a weight NaN", [&](ckpt::Checkpoint& k) { k.params[wpe + 2] = nan; }, "model.safetensors",
       "holds a weight that is not finite: transformer.wpe.weight[2] = nan"},
      {"a weight -inf", [&](ckpt::Checkpoint& k) { k.params.back() = -inf; }, "model.safetensors",
       "holds a weight that is not finite: " + table.back().name + "[" + std::to_string(table.back().numel - 1) + "] = -inf"},
  };
  const std::string expected_moments = "expected finite moments and v >= 0, as AdamW keeps them";
  for (const Case& k : cases) {
    CAPTURE(k.what);
    ckpt::Checkpoint bad = good;
    k.harm(bad);
    // written by save_checkpoint (CRCs and WSUM right) beside an intact older checkpoint
    const std::string out = tmp / ("run_" + std::to_string(&k - cases.data()));
    ckpt::save_checkpoint(out, random_checkpoint(c, table, 3), table, 0);
    ckpt::save_checkpoint(out, bad, table, 0);
    const std::string dir = step_dir(out, 6), path = dir + "/" + k.file;
    const std::string msg = input_error([&] { ckpt::load_checkpoint(dir, table); });
    INFO(msg);
    check_one_line_expected(msg);
    CHECK(msg.find("checkpoint file " + path + " " + k.says) != std::string::npos);
    CHECK(msg.find(k.file == "state.bin" ? expected_moments : "expected finite weights, as train_gpt writes them") !=
          std::string::npos);
    CHECK(msg.find("delete its checkpoint directory to resume from an older one") != std::string::npos);
    CHECK(ckpt::checkpoint_damage(dir) == msg);
    std::vector<std::string> skipped;
    CHECK(ckpt::latest_checkpoint(out, &skipped) == step_dir(out, 3));
    CHECK(skipped == std::vector<std::string>{msg});
    if (k.file == "state.bin") {
      CHECK(input_error([&] { ckpt::checkpoint_info(dir); }) == msg);
      CHECK(input_error([&] { ckpt::parse_state_bytes(read_bytes(path), path); }) == msg);
    } else {
      CHECK(input_error([&] { ckpt::read_safetensors(path, table); }) == msg);
    }
  }
  // the edges AdamW keeps: v 0 and -0, the largest finite m, the smallest v
  ckpt::Checkpoint edge = good;
  edge.v[0] = 0.0f;
  edge.v[1] = -0.0f;
  edge.v[2] = std::numeric_limits<float>::denorm_min();
  edge.m[0] = -std::numeric_limits<float>::max();
  edge.m[1] = std::numeric_limits<float>::max();
  edge.params[wpe] = std::numeric_limits<float>::max();
  ckpt::save_checkpoint(tmp / "edge", edge, table, 0);
  const ckpt::Checkpoint back = ckpt::load_checkpoint(step_dir(tmp / "edge", 6), table);
  CHECK(same_bits(back.v, edge.v));
  CHECK(same_bits(back.m, edge.m));
  CHECK(same_bits(back.params, edge.params));
}

namespace {

// Safetensors bytes as train_gpt writes them with the dtype of tensor name replaced: the header
// padded again to a multiple of 8 and its length rewritten.
std::string with_dtype(const std::string& bytes, const std::string& name, const std::string& dtype) {
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  std::string header = bytes.substr(8, n);
  const std::string key = "\"" + name + "\":{\"dtype\":\"F32\"";
  const size_t at = header.find(key);
  REQUIRE(at != std::string::npos);
  header.replace(at, key.size(), "\"" + name + "\":{\"dtype\":\"" + dtype + "\"");
  while (!header.empty() && header.back() == ' ') header.pop_back();
  while (header.size() % 8) header += ' ';
  const uint64_t n2 = header.size();
  return std::string(reinterpret_cast<const char*>(&n2), 8) + header + bytes.substr(8 + n);
}

}  // namespace

TEST_CASE("checkpoint: a dtype that is empty or none of the safetensors format's is refused, on lm_head.weight too (never read)") {
  TempDir tmp;
  const Config c = small_config();
  const std::vector<ParamSpec> table = param_table(model_of(c));
  const ckpt::Checkpoint good = random_checkpoint(c, table, 4);
  const std::string weights = ckpt::safetensors_bytes(table, good.params.data(), "n_layer=2", good.vocab);
  const std::string list = "BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, "
                           "C64, F64, I64, U64";
  for (const auto& [name, dtype] : std::vector<std::pair<std::string, std::string>>{
           {"lm_head.weight", ""}, {"lm_head.weight", "F33"}, {"lm_head.weight", "f32"}, {"lm_head.weight", "Q4_0"},
           {"lm_head.weight", "F32 "}, {"transformer.wpe.weight", ""}}) {
    CAPTURE(name);
    CAPTURE(dtype);
    const std::string bad = with_dtype(weights, name, dtype);
    const std::string msg = input_error([&] { ckpt::parse_safetensors(bad, "ck/model.safetensors"); });
    check_one_line_expected(msg);
    CHECK(msg.find("checkpoint file ck/model.safetensors has a bad header entry \"" + name + "\": dtype \"" + dtype +
                   "\" is none of the format's (" + list + ")") != std::string::npos);
    // in a checkpoint, its state.bin's WSUM paired with it as the writer pairs them
    const std::string out = tmp / ("run_" + dtype + "_" + name), dir = step_dir(out, 4);
    ckpt::save_checkpoint(out, good, table);
    write_bytes(dir + "/model.safetensors", bad);
    const ckpt::Checkpoint s = ckpt::parse_state_bytes(read_bytes(dir + "/state.bin"), "s");
    write_bytes(dir + "/state.bin", ckpt::state_bytes(s, s.m.data(), s.v.data(), s.m.size(), ckpt::crc32(bad.data(), bad.size())));
    const std::string load = input_error([&] { ckpt::load_checkpoint(dir, table); });
    CHECK(load.find("checkpoint file " + dir + "/model.safetensors has a bad header entry \"" + name + "\": dtype") !=
          std::string::npos);
    CHECK(ckpt::checkpoint_damage(dir) == load);
    CHECK(ckpt::latest_checkpoint(out) == "");
  }
  // another dtype of the format on the tensor the reader skips: the header reads
  CHECK(ckpt::parse_safetensors(with_dtype(weights, "lm_head.weight", "BF16"), "m").tensors.size() == table.size() + 1);
}

TEST_CASE("checkpoint: latest_checkpoint picks the newest complete one, ignores .tmp and falls back past damage") {
  TempDir tmp;
  const std::string out = tmp / "out";
  CHECK(ckpt::latest_checkpoint(out) == "");  // no directory
  fs::create_directories(out);
  CHECK(ckpt::latest_checkpoint(out) == "");  // empty
  Config c = small_config();
  std::vector<ParamSpec> table = param_table(model_of(c));
  ckpt::save_checkpoint(out, random_checkpoint(c, table, 100), table, 0);
  ckpt::save_checkpoint(out, random_checkpoint(c, table, 200), table, 0);
  CHECK(ckpt::latest_checkpoint(out) == step_dir(out, 200));
  // a complete-looking but unfinished newer one, and names that are no checkpoints
  fs::copy(step_dir(out, 200), step_dir(out, 300) + ".tmp", fs::copy_options::recursive);
  write_bytes(step_dir(out, 900), "a file, not a directory");
  fs::create_directories(out + "/ckpt-abc");
  fs::create_directories(out + "/ckpt-00000999");  // empty: damaged
  CHECK(ckpt::latest_checkpoint(out) == step_dir(out, 200));
  // an intact checkpoint under a newer step's name: skipped, its name and step said
  fs::copy(step_dir(out, 100), step_dir(out, 500), fs::copy_options::recursive);
  std::vector<std::string> skipped;
  CHECK(ckpt::latest_checkpoint(out, &skipped) == step_dir(out, 200));
  REQUIRE(skipped.size() == 2);
  CHECK(skipped[1] == "checkpoint " + step_dir(out, 500) + " holds step 100; expected step 500 (its name); it was renamed "
                      "or copied from another step: rename it ckpt-00000100 or delete it");
  fs::remove_all(step_dir(out, 500));
  // the newest damaged: falls back
  std::string s = read_bytes(step_dir(out, 200) + "/state.bin");
  s[s.size() - 20] ^= 0x40;
  write_bytes(step_dir(out, 200) + "/state.bin", s);
  CHECK(ckpt::latest_checkpoint(out) == step_dir(out, 100));
  CHECK_NOTHROW(ckpt::load_checkpoint(ckpt::latest_checkpoint(out), table));
  fs::remove(step_dir(out, 100) + "/model.safetensors");
  CHECK(ckpt::latest_checkpoint(out) == "");
}

TEST_CASE("checkpoint: keep=2 deletes older checkpoints and stale .tmp directories") {
  TempDir tmp;
  const std::string out = tmp / "out";
  Config c = small_config();
  std::vector<ParamSpec> table = param_table(model_of(c));
  fs::create_directories(out);
  write_bytes(out + "/metrics.jsonl", "{}\n");
  auto listing = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(out)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  for (uint32_t step = 1; step <= 4; ++step) ckpt::save_checkpoint(out, random_checkpoint(c, table, step), table);
  CHECK(listing() == std::vector<std::string>({"ckpt-00000003", "ckpt-00000004", "metrics.jsonl"}));
  fs::create_directories(step_dir(out, 7) + ".tmp/junk");  // a crashed save
  ckpt::save_checkpoint(out, random_checkpoint(c, table, 5), table);
  CHECK(listing() == std::vector<std::string>({"ckpt-00000004", "ckpt-00000005", "metrics.jsonl"}));
  CHECK(ckpt::latest_checkpoint(out) == step_dir(out, 5));

  // re-saving a step replaces it
  ckpt::Checkpoint again = random_checkpoint(c, table, 5);
  ckpt::save_checkpoint(out, again, table);
  CHECK(listing() == std::vector<std::string>({"ckpt-00000004", "ckpt-00000005", "metrics.jsonl"}));
  CHECK(same_bits(ckpt::load_checkpoint(step_dir(out, 5), table).params, again.params));

  // the one just written stays even when older than keep newer ones
  ckpt::save_checkpoint(out, random_checkpoint(c, table, 3), table, 1);
  CHECK(listing() == std::vector<std::string>({"ckpt-00000003", "ckpt-00000005", "metrics.jsonl"}));

  // keep <= 0 keeps all
  ckpt::save_checkpoint(out, random_checkpoint(c, table, 6), table, 0);
  CHECK(listing().size() == 4);

  // a damaged checkpoint (step 6 copied under step 9's name) is not counted: the two newest
  // intact ones stay, and so does it, being newer (every resume skips it, saying why)
  fs::copy(step_dir(out, 6), step_dir(out, 9), fs::copy_options::recursive);
  REQUIRE(!ckpt::checkpoint_damage(step_dir(out, 9), 9).empty());
  ckpt::save_checkpoint(out, random_checkpoint(c, table, 7), table);
  CHECK(listing() == std::vector<std::string>({"ckpt-00000006", "ckpt-00000007", "ckpt-00000009", "metrics.jsonl"}));
  CHECK(ckpt::latest_checkpoint(out) == step_dir(out, 7));
}

TEST_CASE("checkpoint: write_file_atomic failures throw RuntimeError and keep the old file") {
  TempDir tmp;
  const std::string path = tmp / "f.bin";
  ckpt::write_file_atomic(path, "old");
  CHECK(read_bytes(path) == "old");
  ckpt::write_file_atomic(path, "newer content");
  CHECK(read_bytes(path) == "newer content");
  CHECK(!fs::exists(path + ".tmp"));
  ckpt::write_file_atomic(path, "old");

  auto runtime_error = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const RuntimeError& e) {
      return e.what();
    } catch (const std::exception& e) {
      FAIL_CHECK("threw something else than RuntimeError: " << e.what());
      return "";
    }
    FAIL_CHECK("no RuntimeError thrown");
    return "";
  };
  auto check_msg = [](const std::string& msg, const std::string& p) {
    INFO(msg);
    CHECK(msg.find('\n') == std::string::npos);
    CHECK(msg.find(p) != std::string::npos);
    CHECK(msg.find("expected") != std::string::npos);
  };

  // the parent is a regular file (fails for root too)
  write_bytes(tmp / "plain", "x");
  check_msg(runtime_error([&] { ckpt::write_file_atomic(tmp / "plain" + "/x.bin", "data"); }), tmp / "plain" + "/x.bin");
  CHECK(read_bytes(tmp / "plain") == "x");

  // the temp file cannot be created (its name is taken by a directory): old file intact
  fs::create_directories(path + ".tmp");
  check_msg(runtime_error([&] { ckpt::write_file_atomic(path, "lost"); }), path);
  CHECK(read_bytes(path) == "old");
  fs::remove(path + ".tmp");

  // the rename fails (the target is a non-empty directory): the temp file is removed
  const std::string dir_target = tmp / "adir";
  fs::create_directories(dir_target + "/inside");
  check_msg(runtime_error([&] { ckpt::write_file_atomic(dir_target, "lost"); }), dir_target);
  CHECK(!fs::exists(dir_target + ".tmp"));
  CHECK(fs::is_directory(dir_target + "/inside"));

  // an unwritable directory (only without root: root writes anyway)
  if (::geteuid() != 0) {
    const std::string ro = tmp / "ro";
    fs::create_directories(ro);
    ckpt::write_file_atomic(ro + "/f.bin", "old");
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    check_msg(runtime_error([&] { ckpt::write_file_atomic(ro + "/f.bin", "lost"); }), ro + "/f.bin");
    fs::permissions(ro, fs::perms::owner_all);
    CHECK(read_bytes(ro + "/f.bin") == "old");
    CHECK(!fs::exists(ro + "/f.bin.tmp"));
  }

  // save_checkpoint into a path that is a file
  Config c = small_config();
  std::vector<ParamSpec> table = param_table(model_of(c));
  check_msg(runtime_error([&] { ckpt::save_checkpoint(tmp / "plain", random_checkpoint(c, table, 1), table); }),
            tmp / "plain");
}
