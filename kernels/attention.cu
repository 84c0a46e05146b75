// kernels/attention.cu: the naive / flash switch (see kernels/attention.cuh). No kernels of
// its own: it forwards to kernels/attention_naive.cu or kernels/flash_attn_{fwd,bwd}.cu.
#include "attention.cuh"

#include <stdexcept>

#include "attention_naive.cuh"
#include "flash_attn.cuh"

namespace gpu {

size_t attention_saved_elems(AttentionPath path, int B, int Tn, int NH) {
  const size_t rows = (size_t)B * NH * Tn;
  return path == AttentionPath::Naive ? rows * Tn : rows;
}

bool attention_supported(AttentionPath path, int HS, std::string* why) {
  if (path == AttentionPath::Flash) return flash_attn_supported(HS, why);
  return true;
}

template <typename T>
void attention_forward(const Context& ctx, AttentionPath path, T* out, AttentionSaved<T> saved, const T* qkv,
                       const philox::DropoutKey& key, int B, int Tn, int C, int NH, bool causal) {
  if (path == AttentionPath::Flash)
    flash_attn_forward(ctx, out, saved.lse, qkv, key, B, Tn, C, NH, causal, nullptr, saved.keep);
  else
    attention_naive_forward(ctx, out, saved.att, qkv, key, B, Tn, C, NH, causal, nullptr);
}

template <typename T>
void attention_backward(const Context& ctx, AttentionPath path, T* dqkv, const T* dout, const T* qkv, const T* out,
                        AttentionSaved<T> saved, const philox::DropoutKey& key, int B, int Tn, int C, int NH,
                        bool causal) {
  if (path == AttentionPath::Flash)
    flash_attn_backward(ctx, dqkv, dout, qkv, out, saved.lse, key, B, Tn, C, NH, causal, saved.keep);
  else
    attention_naive_backward(ctx, dqkv, dout, qkv, saved.att, key, B, Tn, C, NH, causal);
}

size_t attention_scratch_bytes(AttentionPath path, int B, int Tn, int C, int NH, size_t elem_size) {
  return path == AttentionPath::Flash ? flash_attn_scratch_bytes(B, Tn, C, NH)
                                      : attention_naive_scratch_bytes(B, Tn, C, NH, elem_size);
}

#define TG_INSTANTIATE(T)                                                                                   \
  template void attention_forward<T>(const Context&, AttentionPath, T*, AttentionSaved<T>, const T*,      \
                                     const philox::DropoutKey&, int, int, int, int, bool);                 \
  template void attention_backward<T>(const Context&, AttentionPath, T*, const T*, const T*, const T*,    \
                                      AttentionSaved<T>, const philox::DropoutKey&, int, int, int, int, bool);
TG_INSTANTIATE(float)
TG_INSTANTIATE(bf16)
#undef TG_INSTANTIATE

}  // namespace gpu
