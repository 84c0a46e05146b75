// kernels/cpu/dropout.h: dropout on a (B, T, C) activation (the embedding, attention-output
// and MLP-output sites). The mask comes from kernels/philox.h, element (b, t, c) keyed as
// (bh = b, i = t, j = c); it is never stored: the backward regenerates it.
//   out = keep ? inp * scale : 0,   scale = 1 / (1 - p)
// forward overwrites out (out may alias inp); backward accumulates (+=) into dinp.
// key.threshold == 0 (p = 0) is the identity (a copy).
#pragma once
#include "../philox.h"

namespace cpu {

template <typename T>
void dropout_forward(T* out,       // (B, T, C)
                     const T* inp,  // (B, T, C)
                     const philox::DropoutKey& key, int B, int Tn, int C);

template <typename T>
void dropout_backward(T* dinp,       // (B, T, C) +=
                      const T* dout,  // (B, T, C)
                      const philox::DropoutKey& key, int B, int Tn, int C);

// The keep decisions for (B, T, C) as 0/1 bytes: for tests.
void dropout_mask(unsigned char* mask, const philox::DropoutKey& key, int B, int Tn, int C);

}  // namespace cpu
