// kernels/cpu/layernorm.h: layer normalisation over the last dimension (the CPU reference).
//   mean = sum_c x_c / C,  rstd = 1 / sqrt(sum_c (x_c - mean)^2 / C + 1e-5)
//   out_c = (x_c - mean) * rstd * weight_c + bias_c
// forward overwrites out, mean, rstd; backward accumulates (+=) into dinp, dweight, dbias.
// bias may be null (the model's bias=false switch); then dbias is null too.
#pragma once

namespace cpu {

constexpr double kLayerNormEps = 1e-5;

template <typename T>
void layernorm_forward(T* out,           // (N, C)
                       T* mean,          // (N)
                       T* rstd,          // (N)
                       const T* inp,     // (N, C)
                       const T* weight,  // (C)
                       const T* bias,    // (C) or null
                       int N, int C);

template <typename T>
void layernorm_backward(T* dinp,          // (N, C) +=
                        T* dweight,       // (C)    +=
                        T* dbias,         // (C)    += or null
                        const T* dout,    // (N, C)
                        const T* inp,     // (N, C)
                        const T* weight,  // (C)
                        const T* mean,    // (N)
                        const T* rstd,    // (N)
                        int N, int C);

}  // namespace cpu
