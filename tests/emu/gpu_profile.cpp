// tests/emu/gpu_profile.cpp: build/gpu_profile (make gpu-profile): one training step of a preset
// on the CUDA backend, run by the emulator with the kernel profiler on (tests/emu/kernel_profiler.h),
// one row per kernel and for the cuBLAS GEMMs: launches, compulsory and moved bytes, FLOPs, sector
// efficiency, bank conflicts, registers, spills and theoretical occupancy (the real nvcc build's,
// tests/emu/occupancy.h), and a roofline lower bound of each on an H100 SXM or an A100 SXM; then the
// step's bound, the MFU it would give, and the floor its launch count sets. Each part's step is
// emulated on that part (TG_EMU_DEVICE), so each runs the kernels it would choose: the Hopper
// flash kernels on the H100, the mma.sync ones on the A100.
//
//   build/gpu_profile [--preset shakespeare-char|gpt2-124m] [--attention flash|naive]
//                     [--gpu h100|a100|both] [--resources TABLE]... [--check]
//
// The registers and occupancy come from ptxas's tables: by default build/kernel_resources.txt (or
// TG_KERNEL_RESOURCES) and, beside it, kernel_resources_hopper.txt (the sm_90a kernels); each
// --resources names one table and replaces the defaults.
//
// What is exact and what is modeled. The counts of a profiled step are exact properties of the
// code at that shape (emulated). A full preset is too slow to emulate, so the step is emulated at
// L = 1, 2 layers and B = 1, 2 sequences (the preset's T), and every count is taken as
// bilinear in (L, B): c(L, B) = c00 + cL L + cB B + cLB L B, fitted exactly to the four runs and
// evaluated at the preset's L and B (--check emulates (L, B) = (3, 2) as well and prints how far
// the fit is from it). A step of --grad-accum k is k forward + backward passes and one update.
// The scaled counts, and everything derived from peak figures (times, MFU), are MODELED.
// GEMM arithmetic is skipped while profiling (their counts do not need it, and no other kernel's
// memory accesses depend on values), so the reference BLAS does not dominate the run.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "../../model/run/config.h"
#include "../../model/net/gpt.h"
#include "../../model/net/gpt_cuda.cuh"
#include "emu_internal.h"
#include "kernel_profiler.h"
#include "occupancy.h"

namespace {

// Peak figures of the parts (dense, no sparsity), from NVIDIA's data sheets: H100 SXM 3.35 TB/s
// HBM3, 989 TFLOP/s bf16 tensor, 67 TFLOP/s fp32; A100 SXM 80 GB 2.039 TB/s HBM2e, 312 TFLOP/s
// bf16 tensor, 19.5 TFLOP/s fp32.
struct Peaks {
  const char* name;
  const char* device;  // TG_EMU_DEVICE: the emulated part the step runs on
  int sm;
  double bytes_per_s, tensor_flops, fp32_flops;
};
const Peaks kH100{"H100 SXM", "h100", 90, 3.35e12, 989e12, 67e12};
const Peaks kA100{"A100 SXM", "a100", 80, 2.039e12, 312e12, 19.5e12};
// A kernel launch without CUDA graphs costs the host a few microseconds; the floor below
// assumes 3 us a launch (an assumption, not a measurement: measure it on the GPU).
constexpr double kLaunchSeconds = 3e-6;

// The counts of one row, as doubles (they are scaled).
struct Row {
  std::string name;  // short kernel name, or "cuBLAS GEMMs"
  std::string full;  // demangled kernel name (for the resource table)
  double launches = 0, compulsory = 0, moved = 0, requested = 0, tensor_flops = 0;
  double shared_requests = 0, conflicts = 0;
  unsigned block = 0;
  size_t dynamic_smem = 0;
};

using Table = std::map<std::string, Row>;

void add_counts(Table& t, const emu::KernelProfiler& p, double times) {
  for (const emu::KernelCounters& k : p.per_kernel()) {
    Row& r = t[k.kernel];
    r.full = k.kernel;
    r.name = emu::occ::short_name(k.kernel);
    r.launches += times * (double)k.launches;
    r.compulsory += times * (double)k.compulsory_bytes();
    r.moved += times * (double)k.moved_bytes();
    // a TMA box's bytes are all asked for (the box is the request), as its loads' bytes are
    r.requested += times * (double)(k.load.bytes + k.store.bytes + k.tma_bytes);
    r.tensor_flops += times * (double)k.mma_flops;
    r.shared_requests += times * (double)(k.shared_load.requests + k.shared_store.requests);
    r.conflicts += times * (double)(k.shared_load.conflicts() + k.shared_store.conflicts());
    r.block = k.block.x * k.block.y * k.block.z;
    r.dynamic_smem = k.dynamic_smem;
  }
  if (!p.gemms().empty()) {
    Row& r = t["~gemm"];
    r.name = r.full = "cuBLAS GEMMs";
    for (const emu::GemmEvent& g : p.gemms()) {
      const double bytes = (double)(g.a_bytes + g.b_bytes + g.c_read_bytes + g.d_bytes);
      r.launches += times;
      r.compulsory += times * bytes;
      r.moved += times * bytes;
      r.requested += times * bytes;
      r.tensor_flops += times * 2.0 * g.m * g.n * g.k * g.batch;
    }
  }
}

struct Shape {
  int L, B;
};

// One step at (L, B): forward + backward counted into `micro`, the update into `update`.
void profile_step(const tg::Config& c, int V, int Vp, const Shape& s, gpu::AttentionPath path, Table& micro,
                  Table& update) {
  const tg::ModelConfig m{V, c.block_size, s.L, c.n_head, c.n_embd, c.bias, Vp};
  tg::RunShape rs;
  rs.B = s.B;
  rs.T = c.block_size;
  rs.dropout = c.dropout;
  rs.attention = path;
  rs.grad_clip = c.grad_clip;
  tg::GPTCuda<gpu::bf16> gpt(m, rs);
  std::vector<float> w(tg::param_table(m).back().offset + tg::param_table(m).back().numel);
  tg::init_params(w.data(), tg::param_table(m), 1);
  gpt.upload_state(w.data(), nullptr, nullptr);
  const size_t BT = (size_t)s.B * c.block_size;
  std::vector<int32_t> x(BT), y(BT);
  std::mt19937 g(7);
  for (size_t i = 0; i < BT; ++i) x[i] = (int32_t)(g() % (unsigned)V), y[i] = (int32_t)(g() % (unsigned)V);
  cudaDeviceSynchronize();
  {
    emu::KernelProfiler p;
    gpt.forward(x.data(), y.data(), s.B, c.block_size, true, 1);
    gpt.backward();
    cudaDeviceSynchronize();
    add_counts(micro, p, 1);
  }
  {
    emu::KernelProfiler p;
    gpt.update(1e-3f, 1);
    (void)gpt.read_stats();
    cudaDeviceSynchronize();
    add_counts(update, p, 1);
  }
}

// into += times x t, row by row.
void add_scaled(Table& into, const Table& t, double times) {
  for (const auto& [key, r] : t) {
    Row& o = into[key];
    o.name = r.name, o.full = r.full, o.block = r.block, o.dynamic_smem = r.dynamic_smem;
    o.launches += times * r.launches;
    o.compulsory += times * r.compulsory;
    o.moved += times * r.moved;
    o.requested += times * r.requested;
    o.tensor_flops += times * r.tensor_flops;
    o.shared_requests += times * r.shared_requests;
    o.conflicts += times * r.conflicts;
  }
}

// c(L, B) from the four corner tables (1,1), (2,1), (1,2), (2,2): the bilinear interpolation's
// weights, extended outside the square.
Table bilinear(const Table* t[4], double L, double B) {
  const double wl = L - 1, wb = B - 1;
  const double w[4] = {(1 - wl) * (1 - wb), wl * (1 - wb), (1 - wl) * wb, wl * wb};
  Table out;
  for (int i = 0; i < 4; ++i) add_scaled(out, *t[i], w[i]);
  return out;
}

double rel(double a, double b) { return a == b ? 0 : std::fabs(a - b) / std::max(std::fabs(a), std::fabs(b)); }

// The largest relative difference between fitted and emulated counts, over the rows that hold
// at least 1% of the emulated compulsory bytes (a tiny kernel's few sectors need not scale).
double max_deviation(const Table& fit, const Table& got, std::string* where) {
  double worst = 0, bytes = 0;
  for (const auto& [key, r] : got) bytes += r.compulsory;
  for (const auto& [key, r] : got) {
    if (r.compulsory < 0.01 * bytes) continue;
    auto it = fit.find(key);
    const Row f = it == fit.end() ? Row{} : it->second;
    for (auto [a, b, what] : {std::make_tuple(f.launches, r.launches, "launches"),
                              std::make_tuple(f.compulsory, r.compulsory, "compulsory bytes"),
                              std::make_tuple(f.moved, r.moved, "moved bytes"),
                              std::make_tuple(f.tensor_flops, r.tensor_flops, "tensor FLOPs"),
                              std::make_tuple(f.conflicts, r.conflicts, "bank conflicts")}) {
      const double d = rel(a, b);
      if (d > worst) {
        worst = d;
        *where = r.name + " (" + what + ")";
      }
    }
  }
  return worst;
}

std::string human(double v, const char* unit) {
  const char* prefix[] = {"", "k", "M", "G", "T", "P"};
  int i = 0;
  while (std::fabs(v) >= 1000 && i < 5) v /= 1000, ++i;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3g %s%s", v, prefix[i], unit);
  return buf;
}

// The table of the step's rows against the part's peaks, then the step's bound, MFU and launch floor.
void print_roofline(const Table& step, const Peaks& peaks, const emu::occ::ResourceTable& res, const tg::Config& c,
                    int V, int Vp) {
  std::vector<Row> rows;
  for (const auto& [key, r] : step) rows.push_back(r);
  auto bound = [&](const Row& r) {
    return std::max(r.compulsory / peaks.bytes_per_s, r.tensor_flops / peaks.tensor_flops);
  };
  std::sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) { return bound(a) > bound(b); });
  // as written: every sector a kernel moves crosses HBM (no reuse in the caches): an upper estimate
  auto written = [&](const Row& r) {
    return std::max(std::max(r.moved, r.compulsory) / peaks.bytes_per_s, r.tensor_flops / peaks.tensor_flops);
  };
  double total = 0, as_written = 0, launches = 0, bytes = 0, flops = 0;
  for (const Row& r : rows)
    total += bound(r), as_written += written(r), launches += r.launches, bytes += r.compulsory, flops += r.tensor_flops;

  std::printf("\n%s (sm_%d): HBM %.3g TB/s, bf16 tensor %.3g TFLOP/s (peaks; every time below is MODELED)\n", peaks.name,
              peaks.sm, peaks.bytes_per_s / 1e12, peaks.tensor_flops / 1e12);
  std::printf("\n| kernel | launches | share of bound | bound (us, modeled) | bound by | compulsory | moved | sector eff. | "
              "tensor FLOPs | smem conflicts / req | regs | spill st/ld | occupancy (warps/SM) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::string regs = "-", spills = "-", occ = "-";
    for (const emu::occ::KernelResources& k : res.kernels)
      if (k.sm == peaks.sm && k.name == r.full) {
        regs = std::to_string(k.regs);
        spills = std::to_string(k.spill_store_bytes) + "/" + std::to_string(k.spill_load_bytes);
        if (const emu::occ::GpuProfile* part = emu::occ::profile_for_sm(k.sm)) {
          const emu::occ::Occupancy o =
              emu::occ::occupancy(*part, k.regs, (int)r.block, r.dynamic_smem, (size_t)k.static_smem_bytes);
          occ = std::to_string(o.warps_per_sm) + " (" + emu::occ::limits_text(o.limits) + ")";
        }
      }
    const double t = bound(r);
    const bool by_bytes = r.compulsory / peaks.bytes_per_s >= r.tensor_flops / peaks.tensor_flops;
    char eff[32] = "-", conf[32] = "-";
    if (r.moved > 0 && r.full != "cuBLAS GEMMs") std::snprintf(eff, sizeof eff, "%.1f%%", 100 * r.requested / r.moved);
    if (r.shared_requests > 0) std::snprintf(conf, sizeof conf, "%.3g", r.conflicts / r.shared_requests);
    std::printf("| %s | %.0f | %.1f%% | %.1f | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.name.c_str(), r.launches,
                100 * t / total, t * 1e6, by_bytes ? "bytes" : "FLOPs", human(r.compulsory, "B").c_str(),
                r.full == "cuBLAS GEMMs" ? "-" : human(r.moved, "B").c_str(), eff,
                r.tensor_flops > 0 ? human(r.tensor_flops, "FLOP").c_str() : "-", conf, regs.c_str(), spills.c_str(),
                occ.c_str());
  }
  // nanoGPT's estimate of a step's model FLOPs (its estimate_mfu): 6 N + 12 L NH HS T per token
  const tg::ModelConfig full{V, c.block_size, c.n_layer, c.n_head, c.n_embd, c.bias, Vp};
  double n_params = 0;
  for (const tg::ParamSpec& s : tg::param_table(full)) n_params += (double)s.numel;
  const double tokens = (double)c.batch_size * c.block_size * c.grad_accum;
  const double model_flops = tokens * (6 * n_params + 12.0 * c.n_layer * c.n_embd * c.block_size);
  const double launch_floor = launches * kLaunchSeconds;
  std::printf("\nstep (MODELED, scaled from emulated counts): %s compulsory bytes, %s tensor FLOPs, %.0f launches\n",
              human(bytes, "B").c_str(), human(flops, "FLOP").c_str(), launches);
  std::printf("roofline lower bound on the %s: %.3f ms (the sum of the rows' bounds: kernels do not overlap)\n",
              peaks.name, total * 1e3);
  std::printf("as written (every sector the kernels move crosses HBM, nothing reused in the caches): %.3f ms\n",
              as_written * 1e3);
  std::printf("model FLOPs per step (6 N + 12 L C T per token, N = %s): %s; MFU at the bound: %.1f%%\n",
              human(n_params, "").c_str(), human(model_flops, "FLOP").c_str(),
              100 * model_flops / (std::max(total, launch_floor) * peaks.tensor_flops));
  std::printf("launch floor: %.0f launches x %.0f us (assumed, without CUDA graphs) = %.3f ms: the step is bound by %s\n",
              launches, kLaunchSeconds * 1e6, launch_floor * 1e3,
              launch_floor > total ? "launches" : "bytes and FLOPs");
}

int usage(const char* why) {
  std::fprintf(stderr,
               "gpu_profile: %s\nusage: gpu_profile [--preset shakespeare-char|gpt2-124m] [--attention flash|naive] "
               "[--gpu h100|a100|both] [--resources TABLE]... [--check]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "shakespeare-char", attention = "flash", gpu_name = "both";
  const char* env = std::getenv("TG_KERNEL_RESOURCES");
  std::vector<std::string> resources;
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string& into) {
      if (i + 1 >= argc) return false;
      into = argv[++i];
      return true;
    };
    std::string table;
    if (a == "--check") check = true;
    else if (a == "--resources" && value(table)) resources.push_back(table);
    else if (!((a == "--preset" && value(preset)) || (a == "--attention" && value(attention)) ||
               (a == "--gpu" && value(gpu_name))))
      return usage(("unknown or incomplete argument '" + a + "'").c_str());
  }
  if (preset != "shakespeare-char" && preset != "gpt2-124m") return usage("--preset is shakespeare-char or gpt2-124m");
  if (attention != "flash" && attention != "naive") return usage("--attention is flash or naive");
  if (gpu_name != "h100" && gpu_name != "a100" && gpu_name != "both") return usage("--gpu is h100, a100 or both");
  std::vector<const Peaks*> gpus;
  if (gpu_name != "a100") gpus.push_back(&kH100);
  if (gpu_name != "h100") gpus.push_back(&kA100);

  if (resources.empty()) {  // the build's table, and the sm_90a kernels' beside it when there is one
    resources.push_back(env && *env ? env : "build/kernel_resources.txt");
    const size_t slash = resources[0].rfind('/');
    const std::string hopper =
        (slash == std::string::npos ? std::string() : resources[0].substr(0, slash + 1)) + "kernel_resources_hopper.txt";
    if (std::FILE* f = std::fopen(hopper.c_str(), "r")) std::fclose(f), resources.push_back(hopper);
  }
  emu::occ::ResourceTable res;
  for (const std::string& path : resources) {
    try {
      const emu::occ::ResourceTable t = emu::occ::read_resources(path);
      res.kernels.insert(res.kernels.end(), t.kernels.begin(), t.kernels.end());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gpu_profile: %s (make build/kernel_resources.txt writes it)\n", e.what());
      return 1;
    }
  }

  tg::Config c;
  tg::apply_preset(c, preset);
  // the data the preset trains on: tiny Shakespeare's 65 characters, or GPT-2's tokens padded
  const int V = preset == "gpt2-124m" ? 50257 : 65;
  const int Vp = preset == "gpt2-124m" ? tg::padded_vocab_for(V) : V;
  const gpu::AttentionPath path = attention == "flash" ? gpu::AttentionPath::Flash : gpu::AttentionPath::Naive;
  emu::set_gemm_arithmetic(false);

  std::printf("gpu_profile: %s, --attention %s, bf16, T=%d, one step = %d x (B=%d forward + backward) + AdamW\n",
              preset.c_str(), attention.c_str(), c.block_size, c.grad_accum, c.batch_size);
  for (const Peaks* peaks : gpus) {
    setenv("TG_EMU_DEVICE", peaks->device, 1);  // the part's kernels: the launchers choose by its capability
    const Shape corners[4] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}};
    Table micro[4], update[4];
    for (int i = 0; i < 4; ++i) {
      std::fprintf(stderr, "gpu_profile: emulating L=%d, B=%d on the %s\n", corners[i].L, corners[i].B, peaks->name);
      profile_step(c, V, Vp, corners[i], path, micro[i], update[i]);
    }
    const Table* mc[4] = {&micro[0], &micro[1], &micro[2], &micro[3]};
    const Table* uc[4] = {&update[0], &update[1], &update[2], &update[3]};
    if (check) {
      std::fprintf(stderr, "gpu_profile: emulating L=3, B=2 on the %s (the fit's check)\n", peaks->name);
      Table m3, u3;
      profile_step(c, V, Vp, {3, 2}, path, m3, u3);
      std::string w1, w2;
      const double d1 = max_deviation(bilinear(mc, 3, 2), m3, &w1), d2 = max_deviation(bilinear(uc, 3, 2), u3, &w2);
      std::printf("\n%s: fit check at L=3, B=2 (kernels with >= 1%% of the bytes): forward + backward counts within "
                  "%.2g (worst: %s), update within %.2g (worst: %s)\n",
                  peaks->name, d1, w1.empty() ? "-" : w1.c_str(), d2, w2.empty() ? "-" : w2.c_str());
    }
    Table step;
    add_scaled(step, bilinear(mc, c.n_layer, c.batch_size), c.grad_accum);
    add_scaled(step, bilinear(uc, c.n_layer, c.batch_size), 1);
    print_roofline(step, *peaks, res, c, V, Vp);
  }
  return 0;
}
