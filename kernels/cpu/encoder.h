// kernels/cpu/encoder.h: token + position embedding (the CPU reference).
//   out[b, t, :] = wte[inp[b, t], :] + wpe[t, :]
// forward overwrites out; backward accumulates (+=) into dwte and dwpe.
#pragma once
#include <cstdint>

namespace cpu {

template <typename T>
void encoder_forward(T* out,              // (B, T, C)
                     const int32_t* inp,  // (B, T) token ids in [0, V)
                     const T* wte,        // (V, C)
                     const T* wpe,        // (maxT, C), maxT >= Tn
                     int B, int Tn, int C);

template <typename T>
void encoder_backward(T* dwte,             // (V, C)    +=
                      T* dwpe,             // (maxT, C) +=
                      const T* dout,       // (B, T, C)
                      const int32_t* inp,  // (B, T)
                      int B, int Tn, int C);

}  // namespace cpu
