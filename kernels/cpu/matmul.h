// kernels/cpu/matmul.h: a linear layer, y = x W^T + b (the CPU reference, Eigen products).
//   out[n, o] = sum_c inp[n, c] * weight[o, c] + bias[o]
// forward overwrites out; backward accumulates (+=) into dinp, dweight, dbias.
// bias / dbias may be null. dinp may be null (no gradient wanted for the input).
#pragma once

namespace cpu {

template <typename T>
void matmul_forward(T* out,           // (N, OC)
                    const T* inp,     // (N, C)
                    const T* weight,  // (OC, C)
                    const T* bias,    // (OC) or null
                    int N, int C, int OC);

template <typename T>
void matmul_backward(T* dinp,          // (N, C)  += or null
                     T* dweight,       // (OC, C) +=
                     T* dbias,         // (OC)    += or null
                     const T* dout,    // (N, OC)
                     const T* inp,     // (N, C)
                     const T* weight,  // (OC, C)
                     int N, int C, int OC);

// matmul_backward with dinp overwritten (=) instead of accumulated, for a dinp whose only
// contribution is this product (the CPU step's activation gradients: no zeroing pass
// first). The same result as zeroing dinp and calling matmul_backward (0 + x = x).
template <typename T>
void matmul_backward_overwrite(T* dinp,          // (N, C)  =
                               T* dweight,       // (OC, C) +=
                               T* dbias,         // (OC)    += or null
                               const T* dout,    // (N, OC)
                               const T* inp,     // (N, C)
                               const T* weight,  // (OC, C)
                               int N, int C, int OC);

}  // namespace cpu
