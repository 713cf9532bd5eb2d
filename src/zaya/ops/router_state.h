// The ZAYA1 router's state handed from layer to layer (DESIGN.md, "Router"): depth averaging (EDA)
//   r_l = h_l + s_l ⊙ r_{l−1}   (layers l ≥ 1; r_0 = h_0),
// with r_l handed to the next layer undetached, so layer l+1's router backpropagates into r_l.
#pragma once

#include "zaya/core/tensor.h"

namespace zaya::ops {

// r [N, R] holds h_l and becomes r_l in place: r += s ⊙ r_prev (s [R] broadcast over rows).
void eda_forward(const Tensor& r, const Tensor& r_prev, const Tensor& s);

// The router input's gradient at layer l. dr [N, R] holds dL/dr_l from this layer's router; first
// dr += carried (what reached r_l through layer l+1's EDA). Then, where layer l has EDA (r_prev and
// s defined, [N, R] and [R]): ds += Σ_rows dr ⊙ r_prev, and carried = dr ⊙ s becomes the carry for
// layer l−1 (written in place). Without EDA (layer 0) r_prev, s and ds are undefined and carried is
// only read.
void eda_backward(const Tensor& dr, const Tensor& carried, const Tensor& ds, const Tensor& r_prev,
                  const Tensor& s);

}  // namespace zaya::ops
