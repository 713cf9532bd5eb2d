// ParamTable: what an optimizer needs to know of a model, and nothing more: every parameter's name,
// shape and role (model::ParamSpec), its element offset in the flat parameter and gradient buffers,
// the two buffers themselves, and the balancing biases the expert-balance controller updates. The
// optimizer never sees the model object, so the same optimizer serves any model that lays its
// parameters out in flat buffers, on any device, and any slice of them (ZeRO-1's shards).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zaya/core/tensor.h"
#include "zaya/model/params.h"
#include "zaya/model/zaya_model.h"

namespace zaya::optim {

struct ParamTable {
  std::vector<model::ParamSpec> specs;
  std::vector<int64_t> offsets;  // element offset of each parameter in the flat layout
  Tensor grads;                  // flat f32 [P]
  // The f32 values the optimizer updates: the whole flat layout [P] (params_begin 0), or, with
  // bf16 weights, the fp32 master weights of one shard's range only, params[0] being flat element
  // params_begin (train/master_weights.h). An optimizer reads only the elements it owns.
  Tensor params;
  int64_t params_begin = 0;
  Tensor balancing_biases;       // [L, E+1] f32 (not trained by the loss), or undefined

  int64_t numel() const { return grads.numel(); }
  // `shape`'s elements from flat element `at` of the parameters (inside `params`).
  Tensor param_window(int64_t at, const Shape& shape) const { return params.window(at - params_begin, shape); }
  Tensor param(size_t i) const { return param_window(offsets[i], specs[i].shape); }
  Tensor grad(size_t i) const { return grads.window(offsets[i], specs[i].shape); }

  // The table of a ZayaModel: views of its live buffers. An optimizer updates f32 values: with bf16
  // weights its params are the master weights instead (train::MasterWeights::table).
  static ParamTable of(const model::ZayaModel& m);
  // Throws naming the first inconsistency (offsets out of order or past the buffers, a dtype or a
  // size mismatch between params and grads, params not inside the layout).
  void validate(const char* who) const;
};

// The elements [begin, end) of the flat buffers whose optimizer state one optimizer owns: all of
// them on one rank; one contiguous shard per data-parallel rank under ZeRO-1. An end of −1 means
// the end of the buffers.
struct ShardRange {
  int64_t begin = 0;
  int64_t end = -1;
};

// A shard's part of one parameter (or of a state tensor shaped like it) as a checkpoint chunk:
// elements [first, last) of a tensor of `shape` are whole rows of its leading dimension, the box
// starting at `offsets` with extent `shape` in the `global` tensor. Throws naming `name` when the
// elements cut a row (the shard plan never cuts one).
struct RowBox {
  std::vector<int64_t> global, offsets, shape;
};
RowBox row_box(const Shape& shape, int64_t first, int64_t last, const std::string& name);

}  // namespace zaya::optim
