// kernels/cpu/encoder.cpp: token + position embedding, the CPU reference (contract in
// kernels/cpu/encoder.h). Forward: out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]. The map is linear
// in both tables, so the backward scatters dout back: dwte[inp[b,t],:] += dout[b,t,:] (a token
// that appears several times collects the sum of its rows) and dwpe[t,:] += sum_b dout[b,t,:].
// The backward stays serial: rows of dwte collide when tokens repeat.
#include "encoder.h"
#include "real.h"

#include <cstddef>

namespace cpu {

template <typename T>
void encoder_forward(T* out, const int32_t* inp, const T* wte, const T* wpe, int B, int Tn,
                     int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < Tn; ++t) {
      const size_t bt = (size_t)b * Tn + t;
      T* o = out + bt * C;
      const T* we = wte + (size_t)inp[bt] * C;
      const T* pe = wpe + (size_t)t * C;
      for (int c = 0; c < C; ++c) o[c] = we[c] + pe[c];
    }
  }
}

template <typename T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* inp, int B, int Tn,
                      int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < Tn; ++t) {
      const size_t bt = (size_t)b * Tn + t;
      const T* d = dout + bt * C;
      T* dwe = dwte + (size_t)inp[bt] * C;
      T* dpe = dwpe + (size_t)t * C;
      for (int c = 0; c < C; ++c) {
        dwe[c] += d[c];
        dpe[c] += d[c];
      }
    }
  }
}

// the explicit instantiations, for this build's Real (kernels/cpu/real.h: float, or double
// in the tests' TG_CPU_DOUBLE objects)
template void encoder_forward<Real>(Real*, const int32_t*, const Real*, const Real*, int, int, int);
template void encoder_backward<Real>(Real*, Real*, const Real*, const int32_t*, int, int, int);

}  // namespace cpu
