// model/net/shards.h: ZeRO-1's split of the flat parameter vector over the ranks (--zero 1). Rank r
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
#include <string>
#include <vector>

#include "../../data/errors.h"
#include "../run/dist.h"
#include "run_shape.h"

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

// The shard of the n parameters a run's rank updates (RunShape::shard_ranks, shard_rank):
// elements [begin, begin + count); m and v hold opt_elems elements (a whole shard, or all n);
// params and grads are padded to `padded` elements (world equal shards, for NCCL's
// reduce-scatter and all-gather; 0 unsharded).
struct RankShard {
  size_t begin = 0, count = 0, opt_elems = 0, padded = 0;
  RankShard(size_t n, const RunShape& run) : count(n), opt_elems(n) {
    if (run.shard_ranks <= 1) return;
    const Shards s(n, run.shard_ranks);
    begin = s.begin(run.shard_rank);
    count = s.count(run.shard_rank);
    opt_elems = std::min(n, s.size);
    padded = s.padded();
  }
};

// m and v of every shard gathered whole on rank 0 for a checkpoint (both backends): valid from
// gather() until drop(), which an update calls (the gathered copy is then no longer the state).
struct GatheredAdam {
  std::vector<float> m, v;
  // Collective: every rank gives its shard (host memory); rank 0 receives the whole.
  void gather(const float* m_shard, const float* v_shard, const Shards& s, const std::vector<size_t>& counts) {
    if (dist::rank() == 0) {
      m.resize(s.n);
      v.resize(s.n);
    }
    dist::gather(m_shard, m.data(), counts);
    dist::gather(v_shard, v.data(), counts);
  }
  void drop() {
    std::vector<float>().swap(m);
    std::vector<float>().swap(v);
  }
  bool valid() const { return !m.empty(); }
  // Throws RuntimeError when nothing was gathered since the last update.
  void copy_to(std::vector<float>& m_out, std::vector<float>& v_out) const {
    if (!valid())
      throw RuntimeError("the AdamW state is sharded over " + std::to_string(dist::world()) +
                         " ranks (--zero 1) and was not gathered since the last update; expected a checkpoint at a "
                         "step every rank reaches; continue from the previous checkpoint");
    m_out = m;
    v_out = v;
  }
};

}  // namespace tg
