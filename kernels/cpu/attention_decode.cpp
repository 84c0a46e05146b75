// kernels/cpu/attention_decode.cpp: see attention_decode.h.
#include "attention_decode.h"
#include "real.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace cpu {

template <typename T>
void attention_decode_forward(T* out, T* kcache, T* vcache, const T* qkv, int pos, int C, int NH, int maxT) {
  const int HS = C / NH;
  const T sc = T(1) / std::sqrt(T(HS));
  std::vector<T> s((size_t)pos + 1);
  for (int h = 0; h < NH; ++h) {
    T* kc = kcache + (size_t)h * maxT * HS;
    T* vc = vcache + (size_t)h * maxT * HS;
    const T* q = qkv + (size_t)h * HS;
    std::copy(q + C, q + C + HS, kc + (size_t)pos * HS);
    std::copy(q + 2 * C, q + 2 * C + HS, vc + (size_t)pos * HS);
    T mx = -std::numeric_limits<T>::infinity();
    for (int j = 0; j <= pos; ++j) {
      const T* kj = kc + (size_t)j * HS;
      T dot = 0;
      for (int c = 0; c < HS; ++c) dot += q[c] * kj[c];
      s[j] = dot * sc;
      mx = std::max(mx, s[j]);
    }
    T sum = 0;
    for (int j = 0; j <= pos; ++j) sum += s[j] = std::exp(s[j] - mx);
    const T inv = T(1) / sum;
    T* o = out + (size_t)h * HS;
    std::fill(o, o + HS, T(0));
    for (int j = 0; j <= pos; ++j) {
      const T pj = s[j] * inv;
      const T* vj = vc + (size_t)j * HS;
      for (int c = 0; c < HS; ++c) o[c] += pj * vj[c];
    }
  }
}

template <typename T>
void attention_decode_prime(T* kcache, T* vcache, const T* qkv, int n, int C, int NH, int maxT) {
  const int HS = C / NH;
  for (int h = 0; h < NH; ++h)
    for (int t = 0; t < n; ++t) {
      const T* row = qkv + (size_t)t * 3 * C + (size_t)h * HS;
      std::copy(row + C, row + C + HS, kcache + ((size_t)h * maxT + t) * HS);
      std::copy(row + 2 * C, row + 2 * C + HS, vcache + ((size_t)h * maxT + t) * HS);
    }
}

// the explicit instantiations, for this build's Real (kernels/cpu/real.h: float, or double
// in the tests' TG_CPU_DOUBLE objects)
template void attention_decode_forward<Real>(Real*, Real*, Real*, const Real*, int, int, int, int);
template void attention_decode_prime<Real>(Real*, Real*, const Real*, int, int, int, int);

}  // namespace cpu
