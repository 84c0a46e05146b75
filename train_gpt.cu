// train_gpt.cu: main(). Reads the flags, loads tiny Shakespeare, builds the model on a
// backend, trains, evaluates, and prints a sample. No kernels live here.
// Exit status: 0 success, 2 bad usage or input (nothing written), 1 runtime failure, 130 stopped
// by SIGINT / SIGTERM (after writing a checkpoint).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "data/dataset.h"
#include "model/backend.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/errors.h"
#include "model/plot.h"
#include "model/train.h"

#ifndef TG_NO_CUDA
#include <cuda_runtime.h>
#endif

namespace fs = std::filesystem;

namespace {

// Number of usable CUDA devices (0 without a driver, a device or CUDA support in the build).
int cuda_devices() {
#ifndef TG_NO_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
#else
  return 0;
#endif
}

#ifndef TG_NO_CUDA
constexpr bool kHaveCudaBackend = true;
#else
constexpr bool kHaveCudaBackend = false;  // built with g++ alone (make NVCC=)
#endif
#ifdef TG_SIMT_EMULATION
constexpr bool kEmulatedDevice = true;  // train_gpt_emu: the CUDA device is the SIMT emulator of tests/emu
#else
constexpr bool kEmulatedDevice = false;
#endif

// The backend --device asks for, and the line that says why when it was not asked for
// explicitly. Precision bf16 is a GPU precision: the CPU backend runs fp32.
std::unique_ptr<tg::Backend> make_backend(const tg::Config& c, const tg::ModelConfig& m, int gpus, std::string& note) {
  if (c.device == "cuda" && !kHaveCudaBackend)
    throw tg::RuntimeError("--device cuda: this train_gpt was built without the CUDA toolkit; expected a build with nvcc; rebuild with make (nvcc on PATH) or pass --device cpu");
  if (c.device == "cuda" && gpus == 0)
    throw tg::RuntimeError("--device cuda: no usable CUDA device is visible; expected an NVIDIA GPU with its driver; run on such a machine or pass --device cpu");
  const bool cuda = kHaveCudaBackend && gpus > 0 && c.device != "cpu";
  if (!cuda && c.precision == "bf16")
    throw tg::InputError("--precision bf16 on the CPU backend; expected fp32 or auto there (bf16 runs on a GPU); pass --precision fp32 or --device cuda on a GPU machine");
  if (cuda && kEmulatedDevice)
    note = "train_gpt_emu: the CUDA backend runs on the SIMT emulator (every kernel executes on the CPU, slowly, with "
           "every memory access checked): for verifying the CUDA code, not for training";
  else if (c.device == "auto")
    note = cuda ? "a CUDA device is visible: training on the GPU"
                : gpus == 0 ? "no CUDA device visible: training on the CPU"
                            : "a CUDA device is visible, but this build has no CUDA backend: training on the CPU";
#ifndef TG_NO_CUDA
  if (cuda) return tg::make_cuda_backend(c, m);
#endif
  return tg::make_cpu_backend(c, m);
}

// --attention check: both attention paths on the first training batch, per layer.
int attention_check(tg::Backend& be, const tg::Config& c, const data::Dataset& ds) {
  std::vector<int32_t> x((size_t)c.batch_size * c.block_size), y(x.size());
  data::train_batch(ds.train, c.seed, 0, c.batch_size, c.block_size, x.data(), y.data());
  const auto diffs = be.attention_check(x.data(), y.data(), 0);
  std::printf("attention check (step 0 batch, dropout %g, %s): max |flash - naive| / max |naive| per layer\n",
              c.dropout, be.precision().c_str());
  std::printf("layer          O         dQ         dK         dV\n");
  for (size_t l = 0; l < diffs.size(); ++l)
    std::printf("%5zu  %9.3e  %9.3e  %9.3e  %9.3e\n", l, diffs[l].o, diffs[l].dq, diffs[l].dk, diffs[l].dv);
  return 0;
}

// --out-dir must hold no run yet, and its nearest existing ancestor must be a directory this
// process can write in. Checked before anything is loaded or written.
void check_out_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "metrics.jsonl", ec))
    throw tg::InputError("--out-dir " + dir + " already holds a run (metrics.jsonl); expected a new or empty directory; pass another --out-dir or move that one away");
  fs::path p = fs::absolute(dir, ec);
  while (p.has_parent_path() && p != p.parent_path() && !fs::exists(p, ec)) p = p.parent_path();
  if (!fs::is_directory(p, ec))
    throw tg::InputError("--out-dir " + dir + ": " + p.string() + " is not a directory; expected a directory path; pass another --out-dir");
  if (access(p.c_str(), W_OK) != 0)
    throw tg::InputError("--out-dir " + dir + ": cannot write in " + p.string() + "; expected a writable place; pass another --out-dir");
}

// Rewrites metrics.jsonl with only the lines of steps before step (atomically).
void keep_metrics_before(const fs::path& path, int step) {
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    const size_t p = line.find("\"step\": ");
    if (p != std::string::npos && std::atoi(line.c_str() + p + 8) < step) kept += line + "\n";
  }
  tg::ckpt::write_file_atomic(path.string(), kept);
}

// train_gpt --plot OUT.svg RUN/metrics.jsonl...: loss curves of one or more runs, labelled by
// their directory names.
int plot(int argc, char** argv) {
  if (argc < 4)
    throw tg::InputError("--plot needs an output file and at least one metrics file; expected train_gpt --plot OUT.svg RUN/metrics.jsonl ...; see README");
  std::vector<tg::RunCurves> runs;
  for (int i = 3; i < argc; ++i)
    runs.push_back(tg::read_metrics(argv[i], fs::path(argv[i]).parent_path().filename().string()));
  const std::string svg = tg::loss_svg(runs, "train_gpt loss");
  std::ofstream out(argv[2]);
  if (!(out << svg)) throw tg::RuntimeError(std::string("cannot write ") + argv[2] + "; check the path and free space");
  std::cout << "wrote " << argv[2] << " (" << runs.size() << " runs)" << std::endl;
  return 0;
}

// train_gpt --sample --ckpt DIR [--prompt ... --sample-tokens N --temperature T --top-k K
// --top-p P --seed S]: text from a checkpoint's weights (its config gives the model and data).
int sample_from_checkpoint(const tg::Config& flags, int gpus) {
  std::string dir = flags.ckpt;
  if (!fs::exists(fs::path(dir) / "state.bin")) dir = tg::ckpt::latest_checkpoint(flags.ckpt);
  if (dir.empty())
    throw tg::InputError("--ckpt " + flags.ckpt + " is neither a checkpoint nor a run directory holding one; expected a ckpt-<step> directory or a run's --out-dir; pass one of them");
  tg::Config c = tg::ckpt::checkpoint_config(dir);
  c.prompt = flags.prompt;
  c.sample_tokens = flags.sample_tokens;
  c.temperature = flags.temperature;
  c.top_k = flags.top_k;
  c.top_p = flags.top_p;
  c.seed = flags.seed;
  c.batch_size = 1;  // no training batch: the smallest activations
  data::Dataset ds = data::load_dataset(c.data, c.block_size);  // the tokenizer of the run
  try {
    ds.tok.encode(c.prompt);
  } catch (const tg::InputError& e) {
    throw tg::InputError(std::string("--prompt: ") + e.what());
  }
  tg::ModelConfig m{ds.tok.vocab_size(), c.block_size, c.n_layer, c.n_head, c.n_embd, c.bias};
  const auto table = tg::param_table(m);
  tg::ckpt::Checkpoint ck = tg::ckpt::load_checkpoint(dir, table);
  c.device = flags.device;
  c.precision = flags.precision;
  std::string note;
  std::unique_ptr<tg::Backend> be = make_backend(c, m, gpus, note);
  be->set_state(ck.params.data(), ck.m.data(), ck.v.data());
  std::cerr << "sampling from " << dir << " (step " << ck.step << ")" << std::endl;
  tg::sample(*be, c, ds.tok, std::cout);
  return 0;
}

int run(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--plot") return plot(argc, argv);
  const int gpus = cuda_devices();
  // the default preset follows the backend that will train: shakespeare-char needs a GPU
  tg::ParsedArgs args = tg::parse_args(argc, argv, gpus > 0 && kHaveCudaBackend && !kEmulatedDevice ? "shakespeare-char" : "baby");
  if (args.help) { std::cout << tg::usage(); return 0; }
  tg::Config c = args.config;
  if (c.sample) return sample_from_checkpoint(c, gpus);

  // everything that can be wrong with the input is checked before anything is written
  const fs::path metrics_path = fs::path(c.out_dir) / "metrics.jsonl";
  std::string resume_from;  // --resume: the newest complete checkpoint; its config is the run's
  if (c.resume) {
    resume_from = tg::ckpt::latest_checkpoint(c.out_dir);
    // none intact: the newest checkpoint directory, if any, says what is wrong with it
    std::string newest;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(c.out_dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("ckpt-", 0) == 0 && e.path().extension() != ".tmp" && name > fs::path(newest).filename().string())
        newest = e.path().string();
    }
    if (resume_from.empty() && !newest.empty()) tg::ckpt::load_checkpoint(newest, tg::param_table({1, 1, 1, 1, 1, false}));
    if (resume_from.empty())
      throw tg::InputError("--resume: --out-dir " + c.out_dir + " holds no complete checkpoint; expected the --out-dir of a run that wrote checkpoints; pass that directory, or drop --resume to start a new run");
    const std::string out_dir = c.out_dir;
    c = tg::ckpt::checkpoint_config(resume_from);
    c.out_dir = out_dir;
    c.resume = true;
  } else if (c.attention != "check") {  // the check writes nothing
    check_out_dir(c.out_dir);
  }
  data::Dataset ds = data::load_dataset(c.data, c.block_size);
  if (c.sample_tokens > 0) {  // a prompt with characters outside the vocabulary fails now, not after training
    try {
      ds.tok.encode(c.prompt);
    } catch (const tg::InputError& e) {
      throw tg::InputError(std::string("--prompt: ") + e.what());
    }
  }
  tg::ModelConfig m;
  m.vocab_size = ds.tok.vocab_size();
  m.block_size = c.block_size;
  m.n_layer = c.n_layer;
  m.n_head = c.n_head;
  m.n_embd = c.n_embd;
  m.bias = c.bias;
  const auto table = tg::param_table(m);
  const size_t n_params = tg::param_count(table);
  tg::ckpt::Checkpoint start;
  if (c.resume) start = tg::ckpt::load_checkpoint(resume_from, table);
  std::string device_note;
  std::unique_ptr<tg::Backend> be = make_backend(c, m, gpus, device_note);
  if (c.attention == "check") return attention_check(*be, c, ds);
  if (c.resume) be->set_state(start.params.data(), start.m.data(), start.v.data());

  if (!device_note.empty()) std::cout << device_note << "\n";
  if (c.resume)
    std::cout << "resuming from " << resume_from << " at step " << start.step << " (its config below)\n";
  std::cout << tg::describe(c) << "\n"
            << "data: " << ds.path << ", vocab " << m.vocab_size << ", train " << ds.train.size() << " tokens, val "
            << ds.val.size() << " tokens\n"
            << "parameters: " << n_params << " (" << (n_params - table[1].numel) << " without position embeddings)\n"
            << "device: " << be->device_name() << " | attention: " << c.attention << " | precision: " << be->precision() << " | memory: "
            << be->memory_bytes() / (1 << 20) << " MiB" << std::endl;

  fs::create_directories(c.out_dir);
  // a resumed run keeps the metrics of the steps before its checkpoint and logs the rest again
  if (c.resume) keep_metrics_before(metrics_path, (int)start.step);
  std::ofstream metrics(metrics_path, c.resume ? std::ios::app : std::ios::trunc);
  if (!metrics) throw tg::RuntimeError("cannot write " + metrics_path.string() + "; check the permissions and free space of --out-dir");
  auto save = [&](int next_step, int updates) {
    tg::ckpt::Checkpoint ck;
    ck.step = (uint32_t)next_step;
    ck.steps_done = (uint32_t)updates;
    ck.config = c;
    ck.config.resume = false;
    ck.params = be->params();
    be->adam_state(ck.m, ck.v);
    ck.seed = c.seed;
    tg::ckpt::save_checkpoint(c.out_dir, ck, table);
  };
  // SIGINT / SIGTERM: finish the step, write a checkpoint, stop
  struct sigaction sa = {};
  sa.sa_handler = [](int) { tg::request_stop(); };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  tg::TrainSummary s = tg::train(*be, c, ds, std::cout, &metrics, (int)start.step, (int)start.steps_done, save);
  if (s.stopped) {
    std::fprintf(stderr, "interrupted after step %d: checkpoint written in %s; continue the run with: train_gpt --resume --out-dir %s\n",
                 s.steps - 1, c.out_dir.c_str(), c.out_dir.c_str());
    return 130;
  }
  std::printf("done: %d steps in %.1f s, median %.2f ms/step, best val loss %.4f, final train %.4f val %.4f\n", s.steps,
              s.wall_s, s.median_step_ms, s.best_val_loss, s.final_train_loss, s.final_val_loss);
  if (c.sample_tokens > 0) {
    std::cout << "---- sample (" << c.sample_tokens << " characters, temperature " << c.temperature << ", top-k "
              << c.top_k << ") ----" << std::endl;
    tg::sample(*be, c, ds.tok, std::cout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const tg::InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory; expected the run to fit in this machine's memory; reduce --batch-size, --block-size, --n-layer or --n-embd\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
