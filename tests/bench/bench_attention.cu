// tests/bench/bench_attention.cu: attention forward, backward and forward+backward time and
// TFLOP/s of the fused flash kernels (kernels/flash_attn.cuh) and of the naive path
// (kernels/attention_naive.cuh), bf16, causal (--causal 1,0 adds full attention), FlashAttention's
// benchmark shapes by default:
// C = 2048 (NH = C / HS), HS in {64, 128}, B*T = 16384 tokens, T in {512, ..., 16384}, dropout p
// in {0, 0.2} (0.2: nanoGPT's). FLOPs counted as FlashAttention does: forward 4 B NH T^2 HS (halved
// when causal), backward 2.5x the forward. Times: cudaEvents on the context's stream, warm-up,
// then the median of the repetitions. The naive path is skipped where its (B, NH, T, T) buffers
// do not fit in free device memory, or above --naive-max-t. When PyTorch is importable,
// tests/bench/sdpa_peer.py times torch.nn.functional.scaled_dot_product_attention on the same
// shapes and the table gets the ratios ours / PyTorch (< 1: we are faster); --peer none leaves it
// out (a profiler's pass over our kernels alone).
// Paths (--paths): flash (with dropout its forward stores the keep decisions for its backward,
// as train_gpt runs it: flash_attn_keep_bytes), recompute (flash with the backward making the
// decisions again, the keep buffer's alternative; rows at p > 0 only), naive.
//   build/bench_gpu [--csv PATH] [--reps N] [--warmup N] [--hs 64,128] [--t 512,...] [--p 0,0.2]
//                   [--causal 1] [--tokens 16384] [--width 2048] [--naive-max-t T] [--paths flash,naive]
//                   [--peer sdpa|none]
// Exits 0 with one line when no GPU is visible. Under the emulator (build/bench_gpu_emu) it runs
// the same code on tiny shapes (the GPU window's rehearsal): times there are the emulator's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "../../kernels/attention_naive.cuh"
#include "../../kernels/cuda_common.cuh"
#include "../../kernels/flash_attn.cuh"
#include "../../kernels/philox.h"

namespace {

struct Shape {
  int B, T, NH, HS;
  bool causal;
  double p;
  int C() const { return NH * HS; }
};

struct Row {
  Shape s;
  std::string path;        // flash | recompute | naive
  std::string status;      // ok | skipped (why) | error (what)
  double fwd = 0, bwd = 0, fb = 0;           // ms
  double t_fwd = 0, t_bwd = 0, t_fb = 0;     // PyTorch ms (0: not measured)
};

double fwd_flops(const Shape& s) {
  return 4.0 * s.B * s.NH * (double)s.T * s.T * s.HS / (s.causal ? 2.0 : 1.0);
}

// Two timing events, destroyed however the timing ends (a shape whose call throws is reported
// and the run goes on to the next).
struct EventPair {
  cudaEvent_t a{}, b{};
  EventPair() {
    cudaCheck(cudaEventCreate(&a));
    cudaCheck(cudaEventCreate(&b));
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  ~EventPair() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};

// Median of reps timings (ms) of f() on stream st, after warmup calls.
template <typename F>
double median_ms(cudaStream_t st, F&& f, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) f();
  const EventPair ev;
  std::vector<float> ms(reps);
  for (int r = 0; r < reps; ++r) {
    cudaCheck(cudaEventRecord(ev.a, st));
    f();
    cudaCheck(cudaEventRecord(ev.b, st));
    cudaCheck(cudaEventSynchronize(ev.b));
    cudaCheck(cudaEventElapsedTime(&ms[r], ev.a, ev.b));
  }
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2];
}

__global__ void fill_kernel(gpu::bf16* x, size_t n, uint32_t salt) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const uint32_t w = philox::stream_words(salt, philox::kStreamInit, (uint32_t)i, (uint32_t)(i >> 32), 0).v[0];
    x[i] = __float2bfloat16_rn((float)w * 2.3283064e-10f * 2.f - 1.f);  // uniform in [-1, 1)
  }
}

template <typename T>
struct Buf {
  T* p = nullptr;
  explicit Buf(size_t n) { cudaCheck(cudaMalloc(&p, n * sizeof(T))); }
  ~Buf() {
    if (p) cudaFree(p);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

// Times one shape on one path; fills row.fwd / bwd / fb or row.status.
void bench_one(Row& row, int warmup, int reps) {
  const Shape& s = row.s;
  const bool flash = row.path != "naive";
  const size_t nkeep = row.path == "flash" && s.p > 0 ? gpu::flash_attn_keep_bytes(s.B, s.NH, s.T) : 0;
  const size_t nqkv = (size_t)s.B * s.T * 3 * s.C(), nout = (size_t)s.B * s.T * s.C();
  const size_t natt = (size_t)s.B * s.NH * s.T * s.T, nlse = (size_t)s.B * s.NH * s.T;
  const size_t scratch = flash ? gpu::flash_attn_scratch_bytes(s.B, s.T, s.C(), s.NH)
                               : gpu::attention_naive_scratch_bytes(s.B, s.T, s.C(), s.NH, sizeof(gpu::bf16));
  const size_t need = (2 * nqkv + 2 * nout) * sizeof(gpu::bf16) + scratch + gpu::kCublasWorkspaceBytes +
                      (flash ? nlse * sizeof(float) + nkeep : natt * sizeof(gpu::bf16));
  size_t free_b = 0, total_b = 0;
  cudaCheck(cudaMemGetInfo(&free_b, &total_b));
  if (need + (512ull << 20) > free_b) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "skipped (needs %.1f GiB, %.1f GiB free)", need / 1073741824.0, free_b / 1073741824.0);
    row.status = buf;
    return;
  }
  gpu::Context ctx;
  ctx.create(scratch);
  ctx.precision = gpu::Precision::BF16;
  try {
    Buf<gpu::bf16> qkv(nqkv), dqkv(nqkv), out(nout), dout(nout);
    Buf<float> lse(flash ? nlse : 1);
    Buf<gpu::bf16> att(flash ? 1 : natt);
    Buf<uint8_t> keep(std::max<size_t>(nkeep, 1));
    uint8_t* const keep_p = nkeep ? keep.p : nullptr;
    gpu::launch(fill_kernel, 1024, 256, 0, ctx.stream, qkv.p, nqkv, 1);
    gpu::launch(fill_kernel, 1024, 256, 0, ctx.stream, dout.p, nout, 2);
    cudaCheck(cudaMemsetAsync(dqkv.p, 0, nqkv * sizeof(gpu::bf16), ctx.stream));
    const philox::DropoutKey key = philox::make_dropout_key(1234, 1, 0, philox::kSiteAttnProbs, s.p);
    auto fwd = [&] {
      if (flash)
        gpu::flash_attn_forward<gpu::bf16>(ctx, out.p, lse.p, qkv.p, key, s.B, s.T, s.C(), s.NH, s.causal, nullptr,
                                           keep_p);
      else
        gpu::attention_naive_forward<gpu::bf16>(ctx, out.p, att.p, qkv.p, key, s.B, s.T, s.C(), s.NH, s.causal,
                                                nullptr);
    };
    auto bwd = [&] {
      if (flash)
        gpu::flash_attn_backward<gpu::bf16>(ctx, dqkv.p, dout.p, qkv.p, out.p, lse.p, key, s.B, s.T, s.C(), s.NH,
                                            s.causal, keep_p);
      else
        gpu::attention_naive_backward<gpu::bf16>(ctx, dqkv.p, dout.p, qkv.p, att.p, key, s.B, s.T, s.C(), s.NH,
                                                 s.causal);
    };
    row.fwd = median_ms(ctx.stream, fwd, warmup, reps);
    row.bwd = median_ms(ctx.stream, bwd, warmup, reps);  // from the last forward's saved state
    row.fb = median_ms(ctx.stream, [&] { fwd(); bwd(); }, warmup, reps);
    cudaCheck(cudaStreamSynchronize(ctx.stream));
    row.status = "ok";
  } catch (const std::exception& e) {
    row.status = std::string("error: ") + e.what();
    cudaDeviceSynchronize();
  }
  ctx.destroy();
}

bool torch_available() { return std::system("python3 -c 'import torch' >/dev/null 2>&1") == 0; }

// Runs sdpa_peer.py on the shapes; returns ms (fwd, bwd, fwd+bwd) keyed by (HS, T, p, causal).
using PeerKey = std::tuple<int, int, int, int>;
PeerKey peer_key(int HS, int T, double p, bool causal) { return {HS, T, (int)(p * 1000 + 0.5), causal ? 1 : 0}; }
std::map<PeerKey, std::tuple<double, double, double>> run_peer(const std::vector<Shape>& shapes, int reps) {
  std::map<PeerKey, std::tuple<double, double, double>> res;
  std::string arg;
  for (const Shape& s : shapes) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%d,%d,%d,%d,%d,%g", arg.empty() ? "" : ";", s.B, s.T, s.NH, s.HS, (int)s.causal,
                  s.p);
    arg += buf;
  }
  const std::string cmd = "python3 tests/bench/sdpa_peer.py --reps " + std::to_string(reps) + " --shapes '" + arg + "'";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return res;
  char line[512];
  while (std::fgets(line, sizeof line, f)) {
    int B, T, NH, HS, causal;
    double p, a, b, c;
    if (std::sscanf(line, "SDPA B=%d T=%d NH=%d HS=%d causal=%d p=%lf fwd_ms=%lf bwd_ms=%lf fwdbwd_ms=%lf", &B, &T, &NH,
                    &HS, &causal, &p, &a, &b, &c) == 9)
      res[peer_key(HS, T, p, causal != 0)] = {a, b, c};
    else
      std::fputs(line, stdout);  // the peer's own messages (e.g. why it could not run)
  }
  pclose(f);
  return res;
}

// "a,b,c" as numbers; false on anything else
template <typename T>
bool parse_list(const char* text, std::vector<T>& out) {
  out.clear();
  std::string s(text);
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t end = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, end - pos);
    char* rest = nullptr;
    const double v = std::strtod(item.c_str(), &rest);
    if (item.empty() || *rest != '\0' || !(v >= 0) || v > 1e9) return false;
    out.push_back((T)v);
    pos = end + 1;
  }
  return !out.empty();
}

int usage_error(const std::string& what) {
  std::fprintf(stderr, "bench_gpu: %s; expected [--csv PATH] [--reps N] [--warmup N] [--hs 64,128] [--t 512,1024] "
               "[--p 0,0.2] [--causal 1,0] [--tokens N] [--width C] [--naive-max-t T] [--paths flash,recompute,naive] [--peer sdpa|none]; "
               "see tests/bench/bench_attention.cu\n", what.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const char* csv = nullptr;
  int reps = 10, warmup = 3, tokens = 16384, width = 2048, naive_max_t = 1 << 30;
  std::vector<int> head_sizes = {64, 128}, seq_lens = {512, 1024, 2048, 4096, 8192, 16384};
  std::vector<double> drops = {0.0, 0.2};
  std::vector<int> causals = {1};  // --causal: 1 causal, 0 full (every key), or both
  std::vector<std::string> paths = {"flash", "naive"};
  bool peer_sdpa = true;  // --peer none: no SDPA run (a profiler's pass, which times one path)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("build/bench_gpu [--csv PATH] [--reps N] [--warmup N] [--hs 64,128] [--t 512,...] [--p 0,0.2] "
                  "[--causal 1,0] [--tokens 16384] [--width 2048] [--naive-max-t T] [--paths flash,recompute,naive] "
                  "[--peer sdpa|none]: "
                  "attention kernels beside PyTorch SDPA\n");
      return 0;
    }
    if (i + 1 >= argc) return usage_error(a + " without a value");
    const char* v = argv[++i];
    std::vector<int> one;
    if (a == "--csv") csv = v;
    else if (a == "--peer") {
      if (std::strcmp(v, "sdpa") != 0 && std::strcmp(v, "none") != 0)
        return usage_error("--peer " + std::string(v) + ": expected sdpa (the default) or none");
      peer_sdpa = std::strcmp(v, "sdpa") == 0;
    }
    else if (a == "--paths") {
      paths.clear();
      for (size_t pos = 0; pos <= std::strlen(v);) {
        const char* end = std::strchr(v + pos, ',');
        const size_t len = end ? (size_t)(end - v) - pos : std::strlen(v) - pos;
        const std::string name(v + pos, len);
        if (name != "flash" && name != "recompute" && name != "naive")
          return usage_error("--paths " + std::string(v) + ": '" + name + "' is not flash, recompute or naive");
        paths.push_back(name);
        pos += len + 1;
      }
    }
    else if (a == "--hs" ? !parse_list(v, head_sizes)
             : a == "--t" ? !parse_list(v, seq_lens)
             : a == "--p" ? !parse_list(v, drops)
             : a == "--causal" ? !parse_list(v, causals)
             : a == "--reps" || a == "--warmup" || a == "--tokens" || a == "--width" || a == "--naive-max-t"
                 ? !parse_list(v, one) || one.size() != 1
                 : true)
      return usage_error(a + " " + v + (a.rfind("--", 0) == 0 ? " is not a valid value" : " is not an option"));
    if (a == "--reps") reps = std::max(1, one[0]);
    if (a == "--warmup") warmup = one[0];
    if (a == "--tokens") tokens = one[0];
    if (a == "--width") width = one[0];
    if (a == "--naive-max-t") naive_max_t = one[0];
  }
  for (double p : drops)
    if (p >= 1) return usage_error("--p " + std::to_string(p) + " is not below 1");
  for (int HS : head_sizes)
    if (HS == 0 || width % HS != 0) return usage_error("--hs " + std::to_string(HS) + " does not divide --width " + std::to_string(width));
  for (int T : seq_lens)
    if (T == 0) return usage_error("--t 0");
  for (int c : causals)
    if (c != 0 && c != 1) return usage_error("--causal " + std::to_string(c) + " is not 1 (causal) or 0 (full)");

  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("bench_attention: no CUDA device visible; nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop{};
  cudaCheck(cudaGetDeviceProperties(&prop, 0));
  std::printf("bench_attention on %s (sm_%d%d): bf16, C = %d, B*T = %d; median of %d after %d warm-up\n", prop.name,
              prop.major, prop.minor, width, tokens, reps, warmup);

  std::vector<Shape> shapes;
  for (int HS : head_sizes)
    for (int T : seq_lens)
      for (int c : causals)
        for (double p : drops) shapes.push_back(Shape{std::max(1, tokens / T), T, width / HS, HS, c == 1, p});

  std::vector<Row> rows;
  for (const Shape& s : shapes)
    for (const std::string& path : paths) {
      if (path == "recompute" && s.p == 0) continue;  // without dropout it is the flash path
      Row r;
      r.s = s;
      r.path = path;
      if (r.path == "naive" && s.T > naive_max_t) r.status = "skipped (above --naive-max-t)";
      else bench_one(r, warmup, reps);
      std::printf("  HS=%3d T=%5d %s p=%.1f %-9s %s\n", s.HS, s.T, s.causal ? "causal" : "full  ", s.p, path.c_str(),
                  r.status.c_str());
      std::fflush(stdout);
      rows.push_back(r);
    }

  if (!peer_sdpa) {
    std::printf("--peer none: no comparison with scaled_dot_product_attention\n");
  } else if (torch_available()) {
    std::printf("PyTorch found: timing scaled_dot_product_attention with tests/bench/sdpa_peer.py\n");
    const auto peer = run_peer(shapes, reps);
    for (Row& r : rows) {
      auto it = peer.find(peer_key(r.s.HS, r.s.T, r.s.p, r.s.causal));
      if (it != peer.end()) std::tie(r.t_fwd, r.t_bwd, r.t_fb) = it->second;
    }
  } else {
    std::printf("PyTorch not importable: no comparison with scaled_dot_product_attention\n");
  }

  std::printf("\n%4s %6s %3s %3s %-6s %4s %-9s | %8s %8s %8s | %7s %7s %7s | %9s %6s %6s %6s\n", "HS", "T", "B", "NH",
              "mask", "p", "path", "fwd ms", "bwd ms", "f+b ms", "fwd TF", "bwd TF", "f+b TF", "torch f+b", "r_fwd", "r_bwd", "r_f+b");
  for (const Row& r : rows) {
    const Shape& s = r.s;
    std::printf("%4d %6d %3d %3d %-6s %4.2f %-9s | ", s.HS, s.T, s.B, s.NH, s.causal ? "causal" : "full", s.p,
                r.path.c_str());
    if (r.status != "ok") {
      std::printf("%s\n", r.status.c_str());
      continue;
    }
    const double f = fwd_flops(s);
    std::printf("%8.3f %8.3f %8.3f | %7.1f %7.1f %7.1f | ", r.fwd, r.bwd, r.fb, f / r.fwd * 1e-9, 2.5 * f / r.bwd * 1e-9,
                3.5 * f / r.fb * 1e-9);
    if (r.t_fb > 0)
      std::printf("%9.3f %6.2f %6.2f %6.2f\n", r.t_fb, r.fwd / r.t_fwd, r.bwd / r.t_bwd, r.fb / r.t_fb);
    else
      std::printf("%9s %6s %6s %6s\n", "-", "-", "-", "-");
  }

  if (csv) {
    FILE* f = std::fopen(csv, "w");
    if (!f) {
      std::fprintf(stderr, "bench_attention: cannot write %s\n", csv);
      return 1;
    }
    std::fprintf(f, "device,HS,T,B,NH,causal,p,path,status,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,bwd_tflops,fwdbwd_tflops,"
                    "torch_fwd_ms,torch_bwd_ms,torch_fwdbwd_ms\n");
    for (const Row& r : rows) {
      const Shape& s = r.s;
      const double fl = fwd_flops(s);
      const bool ok = r.status == "ok";
      std::fprintf(f, "\"%s\",%d,%d,%d,%d,%d,%g,%s,\"%s\",%.4f,%.4f,%.4f,%.2f,%.2f,%.2f,%.4f,%.4f,%.4f\n", prop.name,
                   s.HS, s.T, s.B, s.NH, (int)s.causal, s.p, r.path.c_str(), r.status.c_str(), r.fwd, r.bwd, r.fb,
                   ok ? fl / r.fwd * 1e-9 : 0.0, ok ? 2.5 * fl / r.bwd * 1e-9 : 0.0, ok ? 3.5 * fl / r.fb * 1e-9 : 0.0,
                   r.t_fwd, r.t_bwd, r.t_fb);
    }
    std::fclose(f);
    std::printf("wrote %s\n", csv);
  }
  return 0;
}
