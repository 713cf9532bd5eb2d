// The float64 cross-entropy reference and target helper shared by tests/ops/test_loss.cc and
// tests/ops/cpu/test_loss_cpu.cc.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "zaya/core/tensor.h"

namespace zaya::ops::loss_test {

using Vec = std::vector<double>;

// Mean over non-ignored rows of logsumexp(h·Eᵀ) − (h·Eᵀ)[t], with the whole [N, V] logits.
inline double ce_reference(const Vec& h, const Vec& e, const std::vector<int32_t>& t, int64_t n, int64_t hd,
                           int64_t v, Vec* lse_out = nullptr) {
  double total = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    Vec logits(v);
    double mx = -INFINITY;
    for (int64_t j = 0; j < v; ++j) {
      double s = 0;
      for (int64_t k = 0; k < hd; ++k) s += h[i * hd + k] * e[j * hd + k];
      logits[j] = s;
      mx = std::max(mx, s);
    }
    double sum = 0;
    for (double l : logits) sum += std::exp(l - mx);
    double lse = mx + std::log(sum);
    if (lse_out) lse_out->push_back(lse);
    if (t[i] == -100) continue;
    total += lse - logits[t[i]];
    ++count;
  }
  return count ? total / count : 0.0;
}

inline Tensor make_targets(const std::vector<int32_t>& t) {
  Tensor out = Tensor::empty({static_cast<int64_t>(t.size())}, DType::i32);
  std::memcpy(out.raw(), t.data(), t.size() * 4);
  return out;
}

}  // namespace zaya::ops::loss_test
