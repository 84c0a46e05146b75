// tests/emu/include/cub/device/device_radix_sort.cuh: cub's DeviceRadixSort::SortPairs
// (DoubleBuffer form) and DoubleBuffer for the emulator build, which puts this folder before the
// CUDA headers on the include path; kernels/encoder.cu includes it unmodified.
//
// The semantics are cub's documented ones: called with d_temp_storage null, only
// temp_storage_bytes is written (here a size that grows with num_items, so a buffer sized for a
// different N is caught); otherwise the (key, value) pairs are sorted by the key bits
// [begin_bit, end_bit) only (other bits ignored), stably, and Current() of both buffers points at
// the output afterwards. Like cub, the sort alternates between the two buffers, one pass per 8
// bits, so after an odd number of passes the output is in the other buffer (the selector flips
// at the call, on the host); the buffer not holding the output is overwritten with garbage, as
// cub leaves it "altered". The sort is queued on the stream like a kernel; the buffers and the
// temporary storage must be device memory (checked before it is queued).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "../../../emu_internal.h"

namespace cub {

template <typename T>
struct DoubleBuffer {
  T* d_buffers[2] = {nullptr, nullptr};
  int selector = 0;
  DoubleBuffer() = default;
  DoubleBuffer(T* current, T* alternate) : d_buffers{current, alternate}, selector(0) {}
  T* Current() { return d_buffers[selector]; }
  T* Alternate() { return d_buffers[selector ^ 1]; }
};

struct DeviceRadixSort {
  template <typename KeyT, typename ValueT, typename NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes, DoubleBuffer<KeyT>& d_keys,
                               DoubleBuffer<ValueT>& d_values, NumItemsT num_items, int begin_bit = 0,
                               int end_bit = (int)sizeof(KeyT) * 8, cudaStream_t stream = 0) {
    static_assert(std::is_unsigned<KeyT>::value, "the emulated sort handles unsigned integer keys");
    const long long n = (long long)num_items;
    if (n < 0 || begin_bit < 0 || end_bit > (int)sizeof(KeyT) * 8 || begin_bit > end_bit) return cudaErrorInvalidValue;
    const size_t need = 1024 + (size_t)(n + 127) / 128 * 16;
    if (!d_temp_storage) {
      temp_storage_bytes = need;
      return cudaSuccess;
    }
    const char* who = "cub::DeviceRadixSort::SortPairs";
    if (temp_storage_bytes < need) return cudaErrorInvalidValue;
    if (emu::sticky_error() != cudaSuccess) return emu::sticky_error();
    std::string why;
    const void* ranges[5] = {d_temp_storage, d_keys.Current(), d_keys.Alternate(), d_values.Current(),
                             d_values.Alternate()};
    const size_t sizes[5] = {need, (size_t)n * sizeof(KeyT), (size_t)n * sizeof(KeyT), (size_t)n * sizeof(ValueT),
                             (size_t)n * sizeof(ValueT)};
    const char* names[5] = {"temporary storage", "keys (current)", "keys (alternate)", "values (current)",
                            "values (alternate)"};
    for (int i = 0; i < 5; ++i)
      if (sizes[i] && !emu::device_range_ok(ranges[i], sizes[i], &why)) {
        emu::set_sticky_error(cudaErrorIllegalAddress, std::string(who) + ": " + names[i] + " " + why);
        return cudaErrorIllegalAddress;
      }
    const int passes = (end_bit - begin_bit + 7) / 8;
    KeyT* kin = d_keys.Current();
    ValueT* vin = d_values.Current();
    const bool flip = passes % 2 == 1;
    KeyT* kout = flip ? d_keys.Alternate() : kin;
    ValueT* vout = flip ? d_values.Alternate() : vin;
    KeyT* kjunk = flip ? kin : d_keys.Alternate();
    ValueT* vjunk = flip ? vin : d_values.Alternate();
    if (flip) d_keys.selector ^= 1, d_values.selector ^= 1;
    const KeyT mask = end_bit - begin_bit >= (int)sizeof(KeyT) * 8 ? (KeyT)~(KeyT)0
                                                                  : (KeyT)(((KeyT)1 << (end_bit - begin_bit)) - 1);
    emu::enqueue(stream, who, [=] {
      std::vector<long long> order((size_t)n);
      std::iota(order.begin(), order.end(), 0LL);
      auto digit = [&](long long i) { return (KeyT)((kin[i] >> begin_bit) & mask); };
      std::stable_sort(order.begin(), order.end(), [&](long long a, long long b) { return digit(a) < digit(b); });
      std::vector<KeyT> k((size_t)n);
      std::vector<ValueT> v((size_t)n);
      for (long long i = 0; i < n; ++i) k[(size_t)i] = kin[order[(size_t)i]], v[(size_t)i] = vin[order[(size_t)i]];
      std::copy(k.begin(), k.end(), kout);
      std::copy(v.begin(), v.end(), vout);
      std::memset(kjunk, 0xA5, (size_t)n * sizeof(KeyT));
      std::memset(vjunk, 0xA5, (size_t)n * sizeof(ValueT));
    });
    return cudaSuccess;
  }
};

}  // namespace cub
