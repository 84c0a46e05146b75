// model/shards.h: ZeRO-1's split of the flat parameter vector over the ranks (--zero 1). Rank r
// owns elements [begin(r), begin(r) + count(r)): its AdamW moments m and v, its share of the
// summed gradients (reduce-scatter), the weights it updates (then all-gathered). Every shard but
// the last ones holds `size` elements, a multiple of kShardAlign; the last hold the rest, possibly
// none, so any parameter count splits over any number of ranks. The alignment is that of the
// CPU's global-norm chunks (kernels/cpu/adamw.h, kNormChunk): each shard is whole chunks, so the
// chunk sums of the shards, added in order, are the norm of the whole vector bit for bit.
// A shard boundary may cut a tensor: each element takes the weight decay of its own tensor.
#pragma once
#include <algorithm>
#include <cstddef>

namespace tg {

constexpr size_t kShardAlign = 8192;

struct Shards {
  size_t n = 0;     // parameters (elements of the flat vector)
  int world = 1;    // ranks
  size_t size = 0;  // elements of a full shard (a multiple of kShardAlign); world x size >= n
  Shards() = default;
  Shards(size_t n_params, int ranks) : n(n_params), world(ranks) {
    const size_t per = (n + (size_t)world - 1) / (size_t)world;
    size = (per + kShardAlign - 1) / kShardAlign * kShardAlign;
  }
  size_t begin(int r) const { return std::min(n, (size_t)r * size); }
  size_t count(int r) const { return std::min(n, begin(r) + size) - begin(r); }
  size_t padded() const { return (size_t)world * size; }  // the vector padded to world equal shards
};

}  // namespace tg
