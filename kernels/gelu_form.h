// kernels/gelu_form.h: which GELU the MLP computes, for the CPU reference (kernels/cpu/gelu.h)
// and the GPU (kernels/gelu.cuh) alike.
//   Tanh  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   GPT-2's and llm.c's (the default);
//                                                            PyTorch nn.GELU(approximate='tanh')
//   Erf   0.5 x (1 + erf(x / sqrt(2)))                       the exact form; nanoGPT's nn.GELU()
#pragma once

enum class GeluForm { Tanh, Erf };
