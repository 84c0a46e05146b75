// model/run/schedule.h: the learning rate at step it, as nanoGPT's get_lr: linear warmup over
// warmup_iters steps, then a cosine from lr down to min_lr at lr_decay_iters, then min_lr.
#pragma once
#include <cmath>

namespace tg {

inline double lr_at(int it, double lr, double min_lr, int warmup_iters, int lr_decay_iters) {
  if (it < warmup_iters) return lr * (it + 1) / (warmup_iters + 1);
  if (it > lr_decay_iters) return min_lr;
  double ratio = double(it - warmup_iters) / double(lr_decay_iters - warmup_iters);
  double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return min_lr + coeff * (lr - min_lr);
}

}  // namespace tg
