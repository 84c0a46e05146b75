// tests/bench/bench_gemm.cpp: the float products of one CPU training step, one thread, on
// the exact shapes and transposes of a thread's slice (baby preset, 2 slices: 384 token rows,
// C = 128, V = 65): Eigen's product (as kernels/cpu/matmul.cpp wrote it before
// kernels/cpu/gemm.cpp) against gemm_f32. For each shape the minimum time over many
// repetitions (robust on a shared machine), its GFLOP/s, and the largest difference between
// the two results relative to the largest |element|, and whether the kernel's result equals
// its portable twin's bit for bit (kernels/cpu/gemm.h; exit status 1 if not). Last, the whole
// causal tiled attention of a slice (kernels/cpu/attention_tiled.cpp), forward and backward.
//   build/bench_gemm [--rows N] [--reps R] [--kernel native|avx2|avx512|portable8|portable16]
// --kernel times another of the build's kernels in the products' column (kernels/cpu/gemm.h; an
// AVX-512 build also has the AVX2 one, so one machine compares the two); the whole attention
// at the end always runs gemm_f32's own.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../../kernels/cpu/attention_tiled.h"
#include "../../kernels/cpu/eigen.h"
#include "../../kernels/cpu/gemm.h"

namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double min_seconds(F&& f, int reps) {
  f();  // warm the caches and the packing buffers
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

std::vector<float> random_floats(size_t n, std::mt19937& g) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}

// One core's fp32 FMA throughput with the kernel's vectors, in flops a cycle, from the processor's
// model (/proc/cpuinfo), and the sentence saying what it rests on. AVX2: two 256-bit FMA pipes
// (Intel since Haswell, AMD since Zen 2): 32. AVX-512: AMD's family 25 (Zen 4) runs a 512-bit FMA
// as two 256-bit halves on its two pipes: 32; family 26 and later (Zen 5): 64; Intel: 64, which
// assumes two 512-bit FMA units (Xeon Gold and Platinum since Skylake-SP, Sapphire Rapids; parts
// with one unit have half).
std::pair<int, std::string> fma_flops_per_cycle(cpu::GemmKernel kern) {
  std::string vendor;
  int family = 0;
  if (std::FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f) && (vendor.empty() || family == 0)) {
      char v[64];
      if (std::sscanf(line, "vendor_id : %63s", v) == 1) vendor = v;
      std::sscanf(line, "cpu family : %d", &family);
    }
    std::fclose(f);
  }
  if (kern != cpu::GemmKernel::Avx512) return {32, "two 256-bit FMA pipes"};
  if (vendor == "AuthenticAMD" && family == 25)
    return {32, "AMD family 25 (Zen 4): 512-bit FMAs as two 256-bit halves"};
  if (vendor == "AuthenticAMD") return {64, "AMD family " + std::to_string(family) + ": two 512-bit FMA pipes"};
  return {64, (vendor.empty() ? std::string("unknown vendor") : vendor) +
                  ": assumed two 512-bit FMA units (parts with one have half this peak)"};
}

// The core clock, from a chain of dependent integer adds of a register (one a cycle): 1e7 of
// them, the fastest of 100 runs. Not adds of an immediate: Intel's cores since Golden Cove (Sapphire
// Rapids) fold chains of those at renaming, several a cycle (a 2.67 GHz Xeon read 6 to 9.9 GHz).
double clock_ghz() {
  double best = 1e30;
  const long one = 1;
  for (int r = 0; r < 100; ++r) {
    long x = 0;
    auto t0 = Clock::now();
    for (long i = 0; i < 10000000 / 8; ++i)
      asm volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
                   "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0"
                   : "+r"(x)
                   : "r"(one));
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 1e7 / best * 1e-9;
}

struct Shape {
  const char* what;
  int M, N, K;  // C (M, N) over K
  int count;    // how many of this product a step runs per slice
};

}  // namespace

int main(int argc, char** argv) {
  int rows = 384, reps = 200;
  cpu::GemmKernel kern = cpu::gemm_kernel_native();
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rows")) rows = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--kernel")) {
      const std::string k = argv[i + 1];
      if (k == "avx2") kern = cpu::GemmKernel::Avx2;
      else if (k == "avx512") kern = cpu::GemmKernel::Avx512;
      else if (k == "portable8") kern = cpu::GemmKernel::Portable8;
      else if (k == "portable16") kern = cpu::GemmKernel::Portable16;
      else if (k != "native") {
        std::fprintf(stderr, "bench_gemm: --kernel %s: expected native, avx2, avx512, portable8 or portable16\n", k.c_str());
        return 2;
      }
      if (!cpu::gemm_kernel_built(kern)) {
        std::fprintf(stderr, "bench_gemm: --kernel %s: this build has no such kernel (it was compiled for another "
                     "instruction set: -march=native on a machine that has it)\n", k.c_str());
        return 2;
      }
    }
  }
  auto gemm = [kern](auto... args) { cpu::gemm_f32_using(kern, args...); };
  // the kernel's portable twin (the same roundings in the same order): each product is computed
  // once more with it and must come out bit for bit the same ("twin": same), else exit 1
  const cpu::GemmKernel twin = kern == cpu::GemmKernel::Avx2     ? cpu::GemmKernel::Portable8
                               : kern == cpu::GemmKernel::Avx512 ? cpu::GemmKernel::Portable16
                                                                 : kern;
  bool twins_differ = false;
  const int C = 128, V = 65, L = 4, R = rows;
  std::mt19937 g(1234);
  Eigen::setNbThreads(1);  // as inside the step's parallel region (else Eigen's product uses every OpenMP thread)
  const double ghz = clock_ghz();
  const auto [flops_cycle, peak_basis] = fma_flops_per_cycle(kern);
  std::printf("core clock about %.2f GHz (a chain of dependent adds): fp32 FMA peak of one core %d flops/cycle (%s) "
              "= %.0f GFLOP/s\n",
              ghz, flops_cycle, peak_basis.c_str(), flops_cycle * ghz);
  std::printf("float products of one slice (%d rows, C=%d, V=%d, %d layers), one thread, min of %d reps, gemm kernel: %s\n",
              R, C, V, L, reps, cpu::gemm_kernel_name(kern));
  std::printf("%-28s %5s %5s %5s %3s %10s %10s %10s %10s %8s %9s %5s\n", "product", "M", "N", "K", "x", "eigen us",
              "gemm us", "eigen GF/s", "gemm GF/s", "speedup", "max rdiff", "twin");
  // kind 0: forward Y = X W^T (X (M, K), W (N, K)); kind 1: dX += dY W (dY (M, K), W (K, N));
  // kind 2: dW += dY^T X (dY (K, M), X (K, N))
  struct Case { Shape s; int kind; };
  const std::vector<Case> cases = {
      {{"fwd qkv   Y = X W^T", R, 3 * C, C, L}, 0},      {{"fwd proj  Y = X W^T", R, C, C, L}, 0},
      {{"fwd fc    Y = X W^T", R, 4 * C, C, L}, 0},      {{"fwd fcprj Y = X W^T", R, C, 4 * C, L}, 0},
      {{"fwd head  Y = X W^T", R, V, C, 1}, 0},          {{"bwd qkv   dX += dY W", R, C, 3 * C, L}, 1},
      {{"bwd proj  dX += dY W", R, C, C, L}, 1},         {{"bwd fc    dX += dY W", R, C, 4 * C, L}, 1},
      {{"bwd fcprj dX += dY W", R, 4 * C, C, L}, 1},     {{"bwd head  dX += dY W", R, C, V, 1}, 1},
      {{"bwd qkv   dW += dY^T X", 3 * C, C, R, L}, 2},   {{"bwd proj  dW += dY^T X", C, C, R, L}, 2},
      {{"bwd fc    dW += dY^T X", 4 * C, C, R, L}, 2},   {{"bwd fcprj dW += dY^T X", C, 4 * C, R, L}, 2},
      {{"bwd head  dW += dY^T X", V, C, R, 1}, 2},
  };
  double total_e = 0, total_g = 0, flops = 0;
  for (const Case& cs : cases) {
    const Shape& s = cs.s;
    const int M = s.M, N = s.N, K = s.K;
    std::vector<float> ce((size_t)M * N, 0.f), cg((size_t)M * N, 0.f), ct((size_t)M * N, 0.f);
    double te = 0, tg = 0;
    if (cs.kind == 0) {
      auto x = random_floats((size_t)M * K, g), w = random_floats((size_t)N * K, g);
      cpu::MapConstMat<float> X(x.data(), M, K), W(w.data(), N, K);
      cpu::MapMat<float> Y(ce.data(), M, N);
      te = min_seconds([&] { Y.noalias() = X * W.transpose(); }, reps);
      tg = min_seconds([&] { gemm(M, N, K, x.data(), K, 1, w.data(), 1, K, cg.data(), N, false); }, reps);
      cpu::gemm_f32_using(twin, M, N, K, x.data(), K, 1, w.data(), 1, K, ct.data(), N, false);
    } else if (cs.kind == 1) {
      auto dy = random_floats((size_t)M * K, g), w = random_floats((size_t)K * N, g);
      cpu::MapConstMat<float> dY(dy.data(), M, K), W(w.data(), K, N);
      cpu::MapMat<float> dX(ce.data(), M, N);
      // accumulating: reset before each timed call would cost as much as a product; the sums
      // grow but stay finite over the repetitions, and the check below recomputes once
      te = min_seconds([&] { dX.noalias() += dY * W; }, reps);
      tg = min_seconds([&] { gemm(M, N, K, dy.data(), K, 1, w.data(), N, 1, cg.data(), N, true); }, reps);
      std::fill(ce.begin(), ce.end(), 0.f);
      std::fill(cg.begin(), cg.end(), 0.f);
      dX.noalias() += dY * W;
      gemm(M, N, K, dy.data(), K, 1, w.data(), N, 1, cg.data(), N, true);
      cpu::gemm_f32_using(twin, M, N, K, dy.data(), K, 1, w.data(), N, 1, ct.data(), N, true);
    } else {
      auto dy = random_floats((size_t)K * M, g), x = random_floats((size_t)K * N, g);
      cpu::MapConstMat<float> dY(dy.data(), K, M), X(x.data(), K, N);
      cpu::MapMat<float> dW(ce.data(), M, N);
      te = min_seconds([&] { dW.noalias() += dY.transpose() * X; }, reps);
      tg = min_seconds([&] { gemm(M, N, K, dy.data(), 1, M, x.data(), N, 1, cg.data(), N, true); }, reps);
      std::fill(ce.begin(), ce.end(), 0.f);
      std::fill(cg.begin(), cg.end(), 0.f);
      dW.noalias() += dY.transpose() * X;
      gemm(M, N, K, dy.data(), 1, M, x.data(), N, 1, cg.data(), N, true);
      cpu::gemm_f32_using(twin, M, N, K, dy.data(), 1, M, x.data(), N, 1, ct.data(), N, true);
    }
    const bool same = std::memcmp(cg.data(), ct.data(), cg.size() * sizeof(float)) == 0;
    twins_differ |= !same;
    double big = 0, diff = 0;
    for (size_t i = 0; i < ce.size(); ++i) {
      big = std::max(big, (double)std::fabs(ce[i]));
      diff = std::max(diff, (double)std::fabs(ce[i] - cg[i]));
    }
    const double f = 2.0 * M * N * K;
    std::printf("%-28s %5d %5d %5d %3d %10.1f %10.1f %10.1f %10.1f %7.2fx %9.1e %5s\n", s.what, M, N, K, s.count,
                te * 1e6, tg * 1e6, f / te * 1e-9, f / tg * 1e-9, te / tg, diff / big, same ? "same" : "DIFF");
    total_e += te * s.count;
    total_g += tg * s.count;
    flops += f * s.count;
  }
  std::printf("%-28s %23s %10.1f %10.1f %10.1f %10.1f %7.2fx   (ms and GFLOP/s of all the products of one slice)\n",
              "one step's products", "", total_e * 1e3, total_g * 1e3, flops / total_e * 1e-9, flops / total_g * 1e-9,
              total_e / total_g);

  // The flash attention's tile products (kernels/cpu/attention_tiled.cpp) at T = 64, HS = 32,
  // one tile of 64 x 64: Q, K, V are (64, 32) slices of qkv (rows 3C apart), dO of out (rows C
  // apart), S / P / dS a (64, 64) tile. Per (b, h) the forward runs the first two, the
  // backward S again and the last four.
  {
    const int Tt = 64, HS = 32, ld = 3 * C;
    auto qkv = random_floats((size_t)Tt * ld, g), dout = random_floats((size_t)Tt * C, g);
    auto p = random_floats((size_t)Tt * Tt, g);
    std::vector<float> se((size_t)Tt * Tt), sg(se.size()), oe((size_t)Tt * HS), og(oe.size());
    using SM = cpu::StridedConstMat<float>;
    const SM Q(qkv.data(), Tt, HS, Eigen::OuterStride<>(ld)), K(qkv.data() + C, Tt, HS, Eigen::OuterStride<>(ld));
    const SM V(qkv.data() + 2 * C, Tt, HS, Eigen::OuterStride<>(ld)), dO(dout.data(), Tt, HS, Eigen::OuterStride<>(C));
    cpu::MapConstMat<float> P(p.data(), Tt, Tt);
    cpu::MapMat<float> Se(se.data(), Tt, Tt), Oe(oe.data(), Tt, HS);
    struct Tile { const char* what; double te, tg, f; };
    std::vector<Tile> tiles;
    const double fs = 2.0 * Tt * Tt * HS;
    tiles.push_back({"S = Q K^T      64x64x32", min_seconds([&] { Se.noalias() = Q * K.transpose(); }, reps),
                     min_seconds([&] { gemm(Tt, Tt, HS, qkv.data(), ld, 1, qkv.data() + C, 1, ld, sg.data(), Tt, false); }, reps), fs});
    tiles.push_back({"O += P V       64x32x64", min_seconds([&] { Oe.noalias() += P * V; }, reps),
                     min_seconds([&] { gemm(Tt, HS, Tt, p.data(), Tt, 1, qkv.data() + 2 * C, ld, 1, og.data(), HS, true); }, reps), fs});
    tiles.push_back({"dP = dO V^T    64x64x32", min_seconds([&] { Se.noalias() = dO * V.transpose(); }, reps),
                     min_seconds([&] { gemm(Tt, Tt, HS, dout.data(), C, 1, qkv.data() + 2 * C, 1, ld, sg.data(), Tt, false); }, reps), fs});
    tiles.push_back({"dK += dS^T Q   64x32x64", min_seconds([&] { Oe.noalias() += P.transpose() * Q; }, reps),
                     min_seconds([&] { gemm(Tt, HS, Tt, p.data(), 1, Tt, qkv.data(), ld, 1, og.data(), HS, true); }, reps), fs});
    std::printf("\nflash attention tile products (T = 64, HS = 32)\n");
    for (const Tile& t : tiles)
      std::printf("%-28s %23s %10.2f %10.2f %10.1f %10.1f %7.2fx\n", t.what, "", t.te * 1e6, t.tg * 1e6, t.f / t.te * 1e-9,
                  t.f / t.tg * 1e-9, t.te / t.tg);
  }

  // The whole causal tiled attention of one slice and layer, as the step calls it (the tile
  // products above plus the softmax, its mask and the rest): rows / T sequences, 4 heads,
  // Br = Bc = 64, p = 0.
  {
    const int Tt = 64, NH = 4, Bs = std::max(1, R / Tt);
    auto qkv = random_floats((size_t)Bs * Tt * 3 * C, g), dout = random_floats((size_t)Bs * Tt * C, g);
    std::vector<float> out((size_t)Bs * Tt * C), lse((size_t)Bs * NH * Tt), dqkv(qkv.size(), 0.f);
    const philox::DropoutKey key = philox::make_dropout_key(1, 0, 0, philox::kSiteAttnProbs, 0.0);
    const double tf = min_seconds([&] {
      cpu::attention_tiled_forward(out.data(), lse.data(), qkv.data(), key, Bs, Tt, C, NH, true, 64, 64, nullptr);
    }, reps);
    const double tb = min_seconds([&] {
      cpu::attention_tiled_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), key, Bs, Tt, C, NH,
                                    true, 64, 64);
    }, reps);
    std::printf("\ncausal tiled attention of one slice (B = %d, T = %d, C = %d, NH = %d), one layer: forward %.1f us, "
                "backward %.1f us\n", Bs, Tt, C, NH, tf * 1e6, tb * 1e6);
  }
  if (twins_differ) {
    std::fprintf(stderr, "bench_gemm: the %s kernel's results differ from its portable twin's (\"twin: DIFF\" above): "
                 "the kernel is wrong on this machine; run build/test_cpu -tc='gemm*'\n", cpu::gemm_kernel_name(kern));
    return 1;
  }
  return 0;
}
