// train_gpt.cu: main(). Reads the flags, lets the run directory (model/run/run_dir.h) decide how
// the run begins, builds the model on a backend, trains, evaluates, and prints a sample. No
// kernels live here.
// model/ is three parts, each including only from those below it: net/ (the network and its
// CPU and CUDA backends), formats/ (the files: checkpoints, safetensors, JSON, the Hugging Face
// export, --init-from's readers, plots), run/ (the config, the training loop, the run
// directory, the ranks, stopping). The one exception is the contract headers of run/
// (config.h, dist.h, stop.h), which the parts below include; data/ and kernels/ are below all.
// Exit status: 0 success, 2 bad usage or input (nothing written), 1 runtime failure, 130 stopped
// by SIGINT / SIGTERM (after writing a checkpoint once a step has run).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "data/bpe.h"
#include "data/dataset.h"
#include "data/errors.h"
#include "data/tokenize.h"
#include "data/tokens.h"
#include "model/formats/checkpoint.h"
#include "model/formats/ckpt_io.h"
#include "model/formats/ckpt_lookup.h"
#include "model/formats/hf_export.h"
#include "model/formats/init_from.h"
#include "model/formats/plot.h"
#include "model/net/attention_check.h"
#include "model/net/backend.h"
#include "model/net/shards.h"
#include "model/run/config.h"
#include "model/run/dist.h"
#include "model/run/run_dir.h"
#include "model/run/train.h"

namespace fs = std::filesystem;

namespace {

// The backend --device asks for (model/net/backend.h), and the line that says why when it was
// not asked for explicitly.
std::unique_ptr<tg::Backend> make_backend(const tg::Config& c, const tg::ModelConfig& m, std::string& note,
                                          double host_bytes_held = 0) {
  return tg::make_backend(c.device, m, tg::run_shape(c), &note, host_bytes_held);
}

bool given(const tg::ParsedArgs& args, const char* flag) {
  return std::find(args.given.begin(), args.given.end(), flag) != args.given.end();
}

// --data when given, else "".
std::string data_flag(const tg::ParsedArgs& args) { return given(args, "data") ? args.config.data : ""; }

// --init-from: the weights read, and the model flags of args.config set from them (those given
// checked against the file).
std::unique_ptr<tg::InitSource> read_init(tg::ParsedArgs& args) {
  args.config.init_from = tg::resolve_init_path(args.config.init_from);  // a model name: the Hugging Face cache's
  auto s = std::make_unique<tg::InitSource>(tg::read_init_source(args.config.init_from, given(args, "n-head") ? args.config.n_head : 0));
  tg::apply_init_model(args.config, args.given, *s);
  return s;
}

// The config a sample runs with: without --prompt, the default prompt (a newline) becomes the
// vocabulary's first character when the text has no newline (tok.default_prompt()); a model of
// tokens (of V, bpe its tokenizer or null) starts from <|endoftext|> (an empty prompt). A prompt
// that is not UTF-8, has characters outside the vocabulary or cannot be encoded fails now, not
// after training.
tg::Config sampling_config(const tg::Config& c, const tg::ParsedArgs& args, const data::CharTokenizer& tok,
                           const data::BpeTokenizer* bpe = nullptr, int V = 0) {
  tg::Config s = c;
  if (tok.itos.empty()) {  // a model of tokens
    if (!given(args, "prompt")) s.prompt = "";
    if (s.sample_tokens > 0) tg::token_prompt(s, V, bpe);
    return s;
  }
  if (!given(args, "prompt") && s.prompt == "\n") s.prompt = tok.default_prompt();
  if (s.sample_tokens == 0) return s;
  try {
    tok.encode(s.prompt);
  } catch (const tg::InputError& e) {
    throw tg::InputError(std::string("--prompt: ") + e.what());
  }
  return s;
}

// The backend of a run, its state from the checkpoint dir when given. The checkpoint is read
// first and its arrays (12 bytes per parameter) are held only until the backend has them: the
// memory check counts them, with what the caller holds (its data).
std::unique_ptr<tg::Backend> backend_from(const tg::Config& c, const tg::ModelConfig& m, std::string& note,
                                          const std::string& dir, double host_bytes_held) {
  if (dir.empty()) return make_backend(c, m, note, host_bytes_held);
  const tg::ckpt::Checkpoint ck = tg::ckpt::load_checkpoint(dir, tg::param_table(m));
  const double arrays = 4.0 * (double)(ck.params.size() + ck.m.size() + ck.v.size());
  std::unique_ptr<tg::Backend> be = make_backend(c, m, note, host_bytes_held + arrays);
  be->set_state(ck.params.data(), ck.m.data(), ck.v.data());
  return be;
}

// Bytes of the data a run holds: its tokens.
double data_bytes(const data::Dataset& ds) { return 4.0 * (double)(ds.train.size() + ds.val.size()); }  // token data: mapped, 0

// --attention check: both attention paths on the first training batch, per layer. Writes nothing.
int attention_check(const tg::Config& c) {
  const data::Dataset ds = data::load_dataset(c.data, c.block_size, c.tokenizer);
  const tg::ModelConfig m = tg::model_config(c, ds.vocab_size(), ds.padded_vocab());
  const tg::RunShape run = tg::run_shape(c);
  std::unique_ptr<tg::Backend> be = tg::make_backend(c.device, m, run, nullptr);
  std::vector<int32_t> x((size_t)c.batch_size * c.block_size), y(x.size());
  ds.train_batch(c.seed, 0, c.batch_size, c.block_size, x.data(), y.data());
  const auto diffs = tg::attention_check(*be, m, run, x.data(), y.data(), 0);
  std::printf("attention check (step 0 batch, dropout %g, %s): max |flash - naive| / max |naive| per layer\n",
              c.dropout, be->precision().c_str());
  std::printf("layer          O         dQ         dK         dV\n");
  for (size_t l = 0; l < diffs.size(); ++l)
    std::printf("%5zu  %9.3e  %9.3e  %9.3e  %9.3e\n", l, diffs[l].o, diffs[l].dq, diffs[l].dk, diffs[l].dv);
  return 0;
}

// train_gpt --plot OUT.svg RUN/metrics.jsonl...: loss curves of one or more runs, labelled by
// their directory names.
int plot(int argc, char** argv) {
  if (argc < 4)
    throw tg::InputError("--plot needs an output file and at least one metrics file; expected train_gpt --plot OUT.svg RUN/metrics.jsonl ...; see README");
  // the output comes first and is overwritten: a metrics file named there (the .svg forgotten) would be lost
  if (fs::path(argv[2]).extension() != ".svg")
    throw tg::InputError("--plot's output " + tg::printable(argv[2]) + " is not an .svg file; expected train_gpt --plot OUT.svg "
                         "RUN/metrics.jsonl ... (the output first); name the .svg file to write first");
  std::vector<tg::RunCurves> runs;
  for (int i = 3; i < argc; ++i)
    runs.push_back(tg::read_metrics(argv[i], fs::path(argv[i]).parent_path().filename().string()));
  // written whole or not at all: an SVG there before stays until the new one replaces it
  tg::ckpt::write_file_atomic(argv[2], tg::loss_svg(runs, "train_gpt loss"));
  std::cout << "wrote " << argv[2] << " (" << runs.size() << (runs.size() == 1 ? " run)" : " runs)") << std::endl;
  return 0;
}

// train_gpt --tokenize IN.txt --tokenizer T --out DIR: the text as llm.c shards (data/tokenize.h).
int tokenize(int argc, char** argv) {
  std::string in, tokenizer, out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], v;
    const size_t eq = a.find('=');
    if (eq != std::string::npos) v = a.substr(eq + 1), a = a.substr(0, eq);
    else if (i + 1 < argc) v = argv[++i];
    std::string* to = a == "--tokenize" ? &in : a == "--tokenizer" ? &tokenizer : a == "--out" ? &out : nullptr;
    if (!to || v.empty())
      throw tg::InputError("--tokenize: " + tg::printable(a) + (to ? " has no value" : " is not one of its flags") +
                           "; expected train_gpt --tokenize IN.txt --tokenizer DIR|FILE --out DIR; see README");
    if (!to->empty())
      throw tg::InputError("--tokenize: option " + a + " given twice; expected it at most once; remove one of them");
    *to = v;
  }
  if (tokenizer.empty() || out.empty())
    throw tg::InputError(std::string("--tokenize without ") + (tokenizer.empty() ? "--tokenizer" : "--out") +
                         "; expected train_gpt --tokenize IN.txt --tokenizer DIR|FILE --out DIR; pass it");
  data::tokenize_file(in, tokenizer, out, std::cerr);
  return 0;
}

// The checkpoint --ckpt names: a ckpt-<step> directory, or a run directory's newest intact one.
std::string checkpoint_of(const tg::Config& flags) {
  const std::string dir = tg::pick_checkpoint(flags.ckpt, std::cerr);
  if (dir.empty())
    throw tg::InputError("--ckpt " + flags.ckpt + " is neither a checkpoint nor a run directory holding one; expected a ckpt-<step> directory or a run's --out-dir; pass one of them");
  return dir;
}

// train_gpt --sample --ckpt DIR [--prompt ... --sample-tokens N --temperature T --top-k K
// --top-p P --seed S]: text from a checkpoint's weights (its config gives the model, the
// vocabulary it holds the tokenizer: no data file needed; --data, when given, is checked to be
// the run's text; a checkpoint from before the vocabulary was stored needs the run's text).
// Reads only: no lock.
int sample_from_checkpoint(const tg::ParsedArgs& args) {
  const tg::Config& flags = args.config;
  tg::Config c;
  data::CharTokenizer tok;
  std::shared_ptr<const data::BpeTokenizer> bpe;  // a model of tokens: --tokenizer, else the run's
  int V = 0;
  std::unique_ptr<tg::Backend> be;
  for (int attempt = 1; !be; ++attempt) {
    const std::string dir = checkpoint_of(flags);
    try {
      const tg::ckpt::CheckpointInfo info = tg::ckpt::checkpoint_info(dir);
      const tg::ModelConfig m = tg::checkpoint_model(dir, info, data_flag(args), tok, std::cerr, &bpe);
      if (!flags.tokenizer.empty() && !tok.itos.empty())
        throw tg::InputError("--tokenizer " + flags.tokenizer + ": checkpoint " + dir + " is a model of characters (" +
                             std::to_string(tok.vocab_size()) + " in its vocabulary), which no tokenizer decodes; "
                             "expected a checkpoint of a run in BPE tokens; drop --tokenizer");
      if (!flags.tokenizer.empty()) bpe = std::make_shared<const data::BpeTokenizer>(data::BpeTokenizer::load(flags.tokenizer));
      V = m.vocab_size;
      c = info.config;  // the flags --sample reads are this command's (sampling, the device)
      for (const std::string& flag : tg::mode_flags(tg::Mode::Sample)) tg::copy_flag(c, flags, flag);
      c.batch_size = 1;  // no training batch: the smallest activations
      c = sampling_config(c, args, tok, bpe.get(), V);
      std::string note;
      be = backend_from(c, m, note, dir, 0);
      std::cerr << "sampling from " << dir << " (step " << info.step << ")" << std::endl;
    } catch (const tg::InputError&) {
      // the run going on in that directory deleted the checkpoint as it was read (it keeps the
      // newest two): read the newest again
      std::error_code ec;
      if (attempt < 10 && dir != flags.ckpt && !fs::exists(dir, ec)) continue;
      throw;
    }
  }
  try {
    if (tok.itos.empty()) tg::sample_tokens(*be, c, V, bpe.get(), std::cout);  // a model of tokens
    else tg::sample(*be, c, tok, std::cout);
  } catch (const tg::Interrupted&) {  // the CPU backend's forward cut short
  }
  if (tg::stop_requested()) {
    std::fprintf(stderr, "interrupted while sampling\n");
    return 130;
  }
  return 0;
}

// train_gpt --export-hf DIR --ckpt RUN_OR_CKPT: the checkpoint's weights as Hugging Face's
// GPT-2 (model/formats/hf_export.h). Reads only: no lock.
int export_checkpoint(const tg::ParsedArgs& args) {
  const tg::Config& flags = args.config;
  const std::string dir = checkpoint_of(flags);
  const tg::ckpt::CheckpointInfo info = tg::ckpt::checkpoint_info(dir);
  data::CharTokenizer tok;
  std::shared_ptr<const data::BpeTokenizer> bpe;
  const tg::ModelConfig m = tg::checkpoint_model(dir, info, data_flag(args), tok, std::cerr, &bpe);
  const tg::ckpt::Checkpoint ck = tg::ckpt::load_checkpoint(dir, tg::param_table(m));
  tg::export_hf(flags.export_hf, m, info.config.gelu, ck.params.data(), tok.chars());
  // the run's tokenizer beside the weights, when it is in Hugging Face's files
  std::string extra = tok.chars().empty() ? "" : ", train_gpt_vocab.json";
  if (bpe)
    for (const auto& [name, bytes] : bpe->files())
      if (name == "vocab.json" || name == "merges.txt" || name == "tokenizer.json") {
        tg::ckpt::write_file_atomic((fs::path(flags.export_hf) / name).string(), bytes);
        extra += ", " + name;
      }
  std::cout << "wrote " << flags.export_hf << " (config.json, model.safetensors" << extra
            << ") from " << dir << " (step " << info.step << "): load it with transformers.GPT2LMHeadModel.from_pretrained(\""
            << flags.export_hf << "\")" << std::endl;
  return 0;
}

// train_gpt --logits IDS --init-from PATH: the model's logits (V numbers, %.9g) at each position
// of the token ids, one line per position, computed as generation computes them (the backend's
// KV cache): for comparing the model with another implementation (tests/interop).
int print_logits(tg::ParsedArgs args) {
  const std::unique_ptr<tg::InitSource> s = read_init(args);
  tg::Config& c = args.config;
  const int V = s->model.vocab_size;
  const std::vector<int32_t> ids = tg::parse_token_ids(c.logits, V, c.block_size);
  c.batch_size = 1;
  std::string note;
  std::unique_ptr<tg::Backend> be = make_backend(c, s->model, note, 4.0 * (double)s->params.size());
  tg::start_from(*be, s->params);
  std::cerr << "logits of " << ids.size() << " tokens from " << s->path << " (" << s->kind << ") on " << be->device_name()
            << ", " << be->precision() << std::endl;
  std::vector<float> logits(V);
  be->generate_reset();
  for (int32_t id : ids) {
    be->generate_step(id, logits.data());
    for (int v = 0; v < V; ++v) std::printf(v ? " %.9g" : "%.9g", logits[v]);
    std::printf("\n");
  }
  return std::fflush(stdout) == 0 ? 0 : 1;
}

// The memory line's optimizer part under ZeRO-1: the AdamW state (m and v, fp32) one rank holds
// against the whole (rank 0's shard, the largest); "" without sharding.
std::string optimizer_memory(const tg::Backend& be, size_t n_params) {
  if (!be.sharded()) return "";
  const tg::Shards sh(n_params, tg::dist::world());
  char buf[256];
  std::snprintf(buf, sizeof buf, " (AdamW state %.1f MiB per rank, sharded over %d ranks by --zero 1; %.1f MiB unsharded)",
                8.0 * (double)sh.count(0) / (1 << 20), tg::dist::world(), 8.0 * (double)n_params / (1 << 20));
  return buf;
}

// Data parallel: one start-up line per rank, each rank's own (gathered by a broadcast from each
// in turn, printed by rank 0).
void describe_ranks(const tg::Backend& be) {
  if (!tg::dist::active()) return;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  char mine[512] = {};
  std::snprintf(mine, sizeof mine, "rank %d of %d: %s, local rank %d, device %s", tg::dist::rank(), tg::dist::world(), host,
                tg::dist::local_rank(), be.device_name().c_str());
  for (int r = 0; r < tg::dist::world(); ++r) {
    char line[sizeof mine];
    std::memcpy(line, mine, sizeof mine);
    tg::dist::broadcast(line, sizeof line, r);
    std::cout << line << "\n";
  }
  const bool cpu = be.device_name().rfind("cpu", 0) == 0;
  std::cout << "data parallel: " << tg::dist::world() << " ranks, ";
  if (be.sharded())
    std::cout << "ZeRO-1 (--zero 1): gradients reduce-scattered by " << (cpu ? "MPI_Reduce_scatter" : "ncclReduceScatter")
              << ", each rank updates its shard, weights all-gathered by " << (cpu ? "MPI_Allgatherv" : "ncclAllGather");
  else
    std::cout << "gradients summed once per step by " << (cpu ? "MPI_Allreduce" : "ncclAllReduce");
  std::cout << "; evaluations spread over the ranks; rank 0 alone logs and writes checkpoints" << std::endl;
}

// Training: the run directory decides how the run begins (new, started again, or resumed),
// the backend trains, and the run directory keeps its metrics and checkpoints.
int train_run(tg::ParsedArgs args) {
  // --init-from: the model's shape from the file before the run is planned (a resumed run has
  // its own; one resumed from step 0, before its first checkpoint, reads the file again below)
  std::unique_ptr<tg::InitSource> init;
  if (!args.config.init_from.empty() && !args.config.resume) {
    init = read_init(args);
    // a Hugging Face directory's tokenizer (or a run's): the data becomes its tokens
    if (args.config.tokenizer.empty()) args.config.tokenizer = tg::init_tokenizer(init->path);
  }
  // data parallel: rank 0 alone holds the lock and writes; every rank plans (reads) first
  const bool writer = tg::dist::rank() == 0;
  tg::RunDir dir(args.config.out_dir, writer);
  std::ostringstream other_rank_warnings;  // dropped: rank 0 says the same
  const tg::RunStart start = dir.plan(args, std::cout, writer ? std::cerr : other_rank_warnings);  // nothing written yet
  tg::dist::barrier();
  const tg::Config& c = start.config;
  const data::Dataset& ds = start.data;
  // the tokenizer (--tokenizer, or --init-from's) came with the data (ds.bpe): token data's ids
  // are below its vocabulary, a text is in its tokens
  const tg::Config sampling = sampling_config(c, args, ds.tok, ds.bpe.get(), ds.vocab_size());
  // (a model of tokens: V padded as llm.c pads it, data::Dataset::padded_vocab)
  const tg::ModelConfig m = tg::model_config(c, ds.vocab_size(), ds.padded_vocab());
  const auto table = tg::param_table(m);
  const size_t n_params = tg::param_count(table);
  std::string device_note;
  std::unique_ptr<tg::Backend> be;
  if (!c.init_from.empty() && start.checkpoint.empty()) {
    if (!init) init = std::make_unique<tg::InitSource>(tg::read_init_source(c.init_from, c.n_head));
    const std::vector<float> w = tg::init_params_for(*init, m, ds.path, ds.tok.chars());
    std::vector<float>().swap(init->params);
    be = make_backend(c, m, device_note, data_bytes(ds) + 12.0 * (double)w.size());  // w and the zero moments
    tg::start_from(*be, w);
  } else {
    be = backend_from(c, m, device_note, start.checkpoint, data_bytes(ds));
  }

  if (!device_note.empty()) std::cout << device_note << "\n";
  if (!start.checkpoint.empty())
    std::cout << "resuming from " << start.checkpoint << " at step " << start.progress.step << " (its config below)\n";
  else if (init)
    std::cout << "init: weights from " << init->path << " (" << init->kind << "), fresh optimizer state, step 0\n";
  std::cout << tg::describe(c) << "\n"
            << "data: " << ds.path << (ds.tokens ? " (" + ds.tokens->format + ")" : std::string()) << ", vocab "
            << m.vocab_size << (m.vp() != m.vocab_size ? " (padded to " + std::to_string(m.vp()) + ")" : std::string())
            << ", train " << ds.train_size() << " tokens, val " << ds.val_size() << " tokens"
            << (ds.bpe ? "\ntokenizer: " + ds.bpe->origin() + (ds.note.empty() ? std::string() : " (" + ds.note + ")") : std::string())
            << "\n"
            << "parameters: " << n_params << " (" << (n_params - table[1].numel) << " without position embeddings)\n"
            << "device: " << be->device_name() << " | attention: " << tg::name(c.attention) << be->attention_note() << " | precision: " << be->precision() << " | memory: "
            << be->memory_bytes() / (1 << 20) << " MiB" << optimizer_memory(*be, n_params) << std::endl;
  describe_ranks(*be);
  if (tg::stop_requested()) {
    std::fprintf(stderr, "interrupted before the run began: nothing written in %s\n", c.out_dir.c_str());
    return 130;
  }

  dir.begin(start);
  tg::TrainSummary s;
  try {
    s = tg::train(*be, c, ds, std::cout, dir.hooks(*be, c, table), start.progress);
  } catch (const tg::InputError& e) {
    // bad input found only now (a token id past the vocabulary inside a shard): a new run that
    // wrote no checkpoint is taken back, so that the command corrected starts afresh
    throw tg::InputError(e.what() + dir.abandon(), e.every_rank);
  }
  if (s.stopped && !writer) return 130;
  if (s.stopped) {
    const std::string resume = "continue the run with: train_gpt --resume --out-dir " + c.out_dir;
    if (s.checkpoint.empty())
      std::fprintf(stderr, "interrupted before step %d: nothing new to save; %s\n", start.progress.step, resume.c_str());
    else
      std::fprintf(stderr, "interrupted after step %d: checkpoint written in %s; %s\n", s.steps - 1, s.checkpoint.c_str(),
                   resume.c_str());
    return 130;
  }
  std::printf("done: %d steps in %.1f s, median %.2f ms/step, best val loss %.4f, final train %.4f val %.4f\n", s.steps,
              s.wall_s, s.median_step_ms, s.best_val_loss, s.final_train_loss, s.final_val_loss);
  if (sampling.sample_tokens > 0 && writer) {
    std::cout << "---- sample (" << sampling.sample_tokens << (ds.tokens ? " tokens" : " characters") << ", temperature "
              << sampling.temperature << ", top-k " << sampling.top_k << ") ----" << std::endl;
    try {
      if (ds.tokens) tg::sample_tokens(*be, sampling, m.vocab_size, ds.bpe.get(), std::cout);
      else tg::sample(*be, sampling, ds.tok, std::cout);
    } catch (const tg::Interrupted&) {  // the CPU backend's forward cut short
    }
    if (tg::stop_requested()) {
      std::fprintf(stderr, "interrupted while sampling: the run itself is complete\n");
      return 130;
    }
  }
  return 0;
}

// One line on stderr naming the flags given that the mode does not read, and which modes read
// each (rank 0's, under mpirun).
void warn_ignored(const tg::ParsedArgs& args, tg::Mode mode) {
  const std::vector<std::string> ignored = tg::ignored_flags(args);
  if (ignored.empty() || tg::dist::rank() != 0) return;
  auto mode_name = [](tg::Mode m) { return m == tg::Mode::Train ? std::string("training") : tg::mode_flag(m); };
  std::string list;
  for (const std::string& flag : ignored) {
    std::string readers;
    for (tg::Mode m : tg::modes_reading(flag)) readers += (readers.empty() ? "" : ", ") + mode_name(m);
    list += (list.empty() ? "--" : ", --") + flag + " (read by " + readers + ")";
  }
  const bool one = ignored.size() == 1;
  std::cerr << "warning: " << (mode == tg::Mode::Train ? "when training" : "with " + mode_name(mode))
            << (one ? ", this flag does nothing: " : ", these flags do nothing: ") << list << "; drop "
            << (one ? "it" : "them") << std::endl;
}

int run(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--plot") return plot(argc, argv);
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--tokenize" || std::string(argv[i]).rfind("--tokenize=", 0) == 0) return tokenize(argc, argv);
  // the default preset follows the backend that will train: shakespeare-char needs a GPU
  const tg::CudaDevices gpus = tg::cuda_devices();
  tg::ParsedArgs args = tg::parse_args(argc, argv, gpus.count > 0 && !gpus.emulated ? "shakespeare-char" : "baby");
  if (args.help) { std::cout << tg::usage(); return 0; }
  args.config.world = tg::dist::world();
  const tg::Mode mode = tg::mode(args.config);
  if (tg::dist::active() && mode != tg::Mode::Train)
    throw tg::InputError(std::string(tg::mode_flag(mode)) + " under mpirun with " + std::to_string(tg::dist::world()) +
                         " ranks; expected one process (ranks are for training); run it without mpirun");
  warn_ignored(args, mode);
  switch (mode) {
    case tg::Mode::Sample: return sample_from_checkpoint(args);
    case tg::Mode::ExportHf: return export_checkpoint(args);
    case tg::Mode::Logits: return print_logits(args);
    case tg::Mode::AttentionCheck: return attention_check(args.config);
    case tg::Mode::Train: break;
  }
  return train_run(args);
}

}  // namespace

int main(int argc, char** argv) {
  tg::install_stop_handler();  // before anything slow: a signal from now on is honoured
  std::string error;
  int code = 0;
  bool every_rank = false;  // the error is every rank's (their collectives agreed on it)
  try {
    tg::dist::init(&argc, &argv);  // mpirun -np N: this process is one of N ranks
    if (tg::dist::active()) {
      tg::defer_stop_requests();  // the ranks agree on a stop (model/run/train.cpp)
      if (tg::dist::rank() != 0 && !std::freopen("/dev/null", "w", stdout))  // rank 0 speaks for all
        throw tg::RuntimeError("cannot silence rank " + std::to_string(tg::dist::rank()) + "'s output");
    }
    code = run(argc, argv);
  } catch (const tg::InputError& e) {
    error = e.what();
    code = 2;
    every_rank = e.every_rank;
  } catch (const tg::Interrupted&) {  // a stop outside training (--attention check): nothing to save
    std::fprintf(stderr, "interrupted: nothing written\n");
    code = 130;
  } catch (const std::bad_alloc&) {
    error = "out of memory; expected the run to fit in this machine's memory; reduce --batch-size, --block-size, --n-layer or --n-embd";
    code = 1;
  } catch (const std::exception& e) {
    error = e.what();
    code = 1;
  }
  error = tg::one_line(error);  // one line, whatever the paths named in it hold
  // a rank that fails alone ends the whole job (MPI_Abort): no other rank waits for it in a
  // collective. An error every rank has (it names the rank that found it) is rank 0's to print.
  if (!error.empty() && tg::dist::active() && !every_rank)
    tg::dist::abort("error: rank " + std::to_string(tg::dist::rank()) + " of " + std::to_string(tg::dist::world()) + ": " + error, code);
  if (!error.empty() && tg::dist::rank() == 0) std::fprintf(stderr, "error: %s\n", error.c_str());
  // every rank waits for rank 0 (its checkpoint, its sample, its clean-up after an error every
  // rank has): mpirun ends the job as soon as one rank exits with a non-zero status (130 after a
  // stop, 2 after such an error)
  if (error.empty() || every_rank) tg::dist::barrier();
  tg::dist::finalize();
  return code;
}
