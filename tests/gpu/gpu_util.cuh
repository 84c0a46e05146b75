// tests/gpu/gpu_util.cuh: what the GPU tests share: device detection, the skip decorator,
// the check macro, a device buffer that converts to and from the storage type, fresh random
// inputs, and the comparison that reports the worst element.
#pragma once
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../../kernels/cuda_common.cuh"

namespace tg_test {

// Whether this suite runs on the SIMT emulator (the emulator build of tests/emu, where a CPU
// executes every thread) instead of a GPU.
#ifdef TG_SIMT_EMULATION
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

// Whether tests run their reduced matrices: under the emulator, and on a GPU with
// TG_REDUCED_MATRIX=1 (compute-sanitizer's runs, .ci/gpu_check.sh sanitize).
inline bool reduced_matrix() {
  static const bool r = kEmulated || std::getenv("TG_REDUCED_MATRIX") != nullptr;
  return r;
}

// A test's list of sizes: `full` on a GPU; the reduced list under the emulator (and with
// TG_REDUCED_MATRIX), chosen to keep every code path the full one reaches (tails, partial and
// several tiles, both alignments) and to drop the repeats of a path at larger sizes, which only
// a GPU runs fast enough.
template <typename V>
std::vector<V> device_sizes(std::vector<V> full, std::vector<V> reduced) {
  return reduced_matrix() ? reduced : full;
}

inline bool gpu_available() {
  static const bool yes = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return yes;
}

// A device of compute capability 9.0 (an H100, or the emulator's default device): the Hopper
// kernels' (kernels/flash_attn_hopper.cuh).
inline bool hopper_available() {
  static const bool yes = [] {
    cudaDeviceProp prop{};
    return gpu_available() && cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9 && prop.minor == 0;
  }();
  return yes;
}

// The seed of this run's random inputs: TG_TEST_SEED when set (to replay a failure), else
// fresh; printed once by tests/gpu/main.cu.
uint64_t test_seed();

// The kernel family flash_attn_forward / _backward<bf16> run for the scope: TG_FLASH_HOPPER=1 (the
// Hopper kernels on compute capability 9.0, the default there) or 0 (the mma.sync kernels
// everywhere); the previous value restored at its end.
struct FlashKernels {
  std::string before;
  bool had = false;
  explicit FlashKernels(bool hopper) : FlashKernels(hopper ? "1" : "0") {}
  // value: TG_FLASH_HOPPER's ("2": the Hopper kernels with the warp-specialized backward; "3": with
  // dQ inside the dK / dV kernel; "4": with the forward's keep decisions made by its producer
  // warpgroup; "5": with the backward's kernels not pipelined over their tiles; "6": with the
  // forward on key tiles of 64; "7": with the forward's two consumer warpgroups where it takes three;
  // "8": with the forward's consumer warpgroups not taking turns at their products; "9": with the
  // forward's dropout at head size 64 on three consumer warpgroups and key tiles of 64)
  explicit FlashKernels(const char* value) {
    if (const char* v = std::getenv("TG_FLASH_HOPPER")) had = true, before = v;
    setenv("TG_FLASH_HOPPER", value, 1);
  }
  FlashKernels(const FlashKernels&) = delete;
  FlashKernels& operator=(const FlashKernels&) = delete;
  ~FlashKernels() {
    if (had) setenv("TG_FLASH_HOPPER", before.c_str(), 1);
    else unsetenv("TG_FLASH_HOPPER");
  }
};

// n uninitialised elements of T on the device.
template <typename T>
T* device_alloc(size_t n) {
  T* p = nullptr;
  REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
  return p;
}

// n elements of T at device pointer d, after the device finishes.
template <typename T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> h(n);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

// n values of storage type T at device pointer d, as doubles (after the device finishes).
template <typename T>
std::vector<double> download_doubles(const T* d, size_t n) {
  std::vector<T> tmp(n);
  cudaCheck(cudaDeviceSynchronize());
  if (n) cudaCheck(cudaMemcpy(tmp.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = gpu::to_float(tmp[i]);
  return out;
}

// A device array of n values of storage type T (float or bf16), zeroed; uploads and
// downloads go through double so tests compare against the double CPU reference.
template <typename T>
struct DeviceArray {
  T* ptr = nullptr;
  size_t n = 0;
  DeviceArray() = default;
  explicit DeviceArray(size_t count) : n(count) {
    if (n) {
      cudaCheck(cudaMalloc(&ptr, n * sizeof(T)));
      cudaCheck(cudaMemset(ptr, 0, n * sizeof(T)));
      // gpu::Context's stream is non-blocking: it does not wait for the legacy stream, so
      // setup work on it must be complete before a launcher runs
      cudaCheck(cudaDeviceSynchronize());
    }
  }
  explicit DeviceArray(const std::vector<double>& host) : DeviceArray(host.size()) { upload(host); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (ptr) cudaFree(ptr);
  }
  void upload(const std::vector<double>& host) {
    std::vector<T> tmp(n);
    for (size_t i = 0; i < n; ++i) tmp[i] = gpu::from_float<T>((float)host[i]);
    cudaCheck(cudaMemcpy(ptr, tmp.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    cudaCheck(cudaDeviceSynchronize());  // (see the constructor)
  }
  std::vector<double> download() const { return download_doubles(ptr, n); }
  // The device's bytes as they are (for bitwise comparisons of many runs: no conversion)
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> b(n * sizeof(T));
    if (n) cudaCheck(cudaMemcpy(b.data(), ptr, b.size(), cudaMemcpyDeviceToHost));
    return b;
  }
  // This array's values set to src's (of the same size) on the device.
  void copy_from(const DeviceArray& src) {
    if (n) cudaCheck(cudaMemcpy(ptr, src.ptr, n * sizeof(T), cudaMemcpyDeviceToDevice));
    cudaCheck(cudaDeviceSynchronize());  // (see the constructor)
  }
  // The values as the device holds them (rounded to T), for feeding the CPU reference the
  // same inputs the kernel saw.
  std::vector<double> rounded() const { return download(); }
};

// n values uniform in [lo, hi), from a generator seeded by test_seed() and salt.
inline std::vector<double> random_vector(size_t n, uint64_t salt, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 g(test_seed() * 0x9E3779B97F4A7C15ull + salt);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = u(g);
  return v;
}

// v rounded to storage type T and back (what a kernel reading T sees).
template <typename T>
std::vector<double> round_to(const std::vector<double>& v) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = gpu::to_float(gpu::from_float<T>((float)v[i]));
  return r;
}

// |got - ref| <= atol + rtol * |ref| elementwise; on failure names the worst element (by
// the ratio of error to bound), its index and values, and the count of violations.
inline bool all_close(const std::vector<double>& got, const std::vector<double>& ref, double rtol, double atol,
                      const std::string& what) {
  if (got.size() != ref.size()) {
    MESSAGE(what << ": size " << got.size() << " != " << ref.size());
    return false;
  }
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - ref[i]), bound = atol + rtol * std::fabs(ref[i]);
    const double ratio = std::isfinite(got[i]) ? err / bound : INFINITY;
    if (!(ratio <= 1.0)) ++bad;
    if (!(ratio <= worst_ratio)) { worst_ratio = ratio; worst = i; }
  }
  if (bad)
    MESSAGE(what << ": " << bad << " of " << got.size() << " elements out of tolerance (rtol " << rtol << ", atol "
                 << atol << "); worst at " << worst << ": got " << got[worst] << ", expected " << ref[worst]
                 << " (" << worst_ratio << "x the bound)");
  return bad == 0;
}

// |got - ref| <= bound[i] elementwise, with a bound per element; on failure names the worst
// element (by error / bound), its index and values, and the count of violations.
inline bool within(const std::vector<double>& got, const std::vector<double>& ref, const std::vector<double>& bound,
                   const std::string& what) {
  if (got.size() != ref.size() || got.size() != bound.size()) {
    MESSAGE(what << ": sizes differ");
    return false;
  }
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - ref[i]);
    const bool ok = err <= bound[i];  // false for NaN
    if (!ok) ++bad;
    const double ratio = ok ? (bound[i] > 0 ? err / bound[i] : 0.0) : INFINITY;
    if (!(ratio <= worst_ratio)) { worst_ratio = ratio; worst = i; }
  }
  if (bad)
    MESSAGE(what << ": " << bad << " of " << got.size() << " elements out of bound; worst at " << worst << ": got "
                 << got[worst] << ", expected " << ref[worst] << ", bound " << bound[worst] << " ("
                 << worst_ratio << "x)");
  return bad == 0;
}

// fp32's unit roundoff, 2^-24: the unit of the derived bounds
constexpr double kU32 = 5.9604644775390625e-8;
// the byte a guard region is filled with: one that no kernel writes there
constexpr uint8_t kSentinel = 0xAB;

inline bool bitwise_equal(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// n token ids in [0, V), from the suite's seeded uniform values
inline std::vector<int32_t> random_tokens(size_t n, int V, uint64_t salt) {
  const std::vector<double> u = random_vector(n, salt, 0.0, 1.0);
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = std::min(V - 1, (int)(u[i] * V));
  return t;
}

// The largest |got - ref| over the elements (for error-ratio rules such as flash vs naive).
inline double max_abs_diff(const std::vector<double>& got, const std::vector<double>& ref) {
  double m = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(got[i] - ref[i]);
    m = std::isfinite(d) ? std::max(m, d) : INFINITY;
  }
  return m;
}

// A gpu::Context for one test: created with scratch_bytes of op scratch, destroyed at scope end.
struct TestContext {
  gpu::Context ctx;
  explicit TestContext(size_t scratch_bytes = 0, gpu::Precision p = gpu::Precision::FP32) {
    ctx.create(scratch_bytes);
    ctx.precision = p;
  }
  ~TestContext() {
    cudaDeviceSynchronize();
    ctx.destroy();
  }
};

}  // namespace tg_test

// A GPU test case: skipped (and counted as skipped) without a visible device.
#define TG_GPU_TEST(name) TEST_CASE(name * doctest::skip(!tg_test::gpu_available()))
// A test of the Hopper kernels: skipped (and counted as skipped) without a device of compute
// capability 9.0.
#define TG_HOPPER_TEST(name) TEST_CASE(name * doctest::skip(!tg_test::hopper_available()))

#define TG_CUDA_CHECK(call)                                                                          \
  do {                                                                                               \
    cudaError_t err_ = (call);                                                                       \
    if (err_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(err_), __FILE__, __LINE__, \
                   #call);                                                                           \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)
