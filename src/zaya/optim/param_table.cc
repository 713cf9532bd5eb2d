#include "zaya/optim/param_table.h"

namespace zaya::optim {

ParamTable ParamTable::of(const model::ZayaModel& m) {
  ParamTable t;
  t.specs = m.specs();
  t.params = m.params_flat();
  t.grads = m.grads_flat();
  t.balancing_biases = m.balancing_biases();
  for (size_t i = 0; i < t.specs.size(); ++i) t.offsets.push_back(m.param_offset(static_cast<int>(i)));
  return t;
}

void ParamTable::validate(const char* who) const {
  ZAYA_CHECK(specs.size() == offsets.size(), who, ": parameter table has ", specs.size(), " specs and ",
             offsets.size(), " offsets");
  ZAYA_CHECK(params.defined() && grads.defined(), who, ": parameter table without parameter or gradient buffer");
  ZAYA_CHECK(params.dtype() == DType::f32 && grads.dtype() == DType::f32, who,
             ": parameter table buffers must be f32, found ", params.str(), " and ", grads.str());
  ZAYA_CHECK(params.device() == grads.device(), who, ": parameters ", params.str(), " and gradients ", grads.str(),
             " are on different devices");
  ZAYA_CHECK(params_begin >= 0 && params_begin + params.numel() <= grads.numel(), who, ": parameters ",
             params.str(), " from flat element ", params_begin, " run past the ", grads.numel(),
             "-element gradient buffer");
  int64_t end = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    ZAYA_CHECK(offsets[i] >= end && offsets[i] + specs[i].shape.numel() <= grads.numel(), who, ": parameter '",
               specs[i].name, "' at offset ", offsets[i], " overlaps the one before it or runs past the ",
               grads.numel(), "-element buffer");
    end = offsets[i] + specs[i].shape.numel();
  }
}

RowBox row_box(const Shape& shape, int64_t first, int64_t last, const std::string& name) {
  RowBox b;
  b.global.assign(shape.begin(), shape.end());
  b.offsets.assign(b.global.size(), 0);
  b.shape = b.global;
  const int64_t n = shape.numel();
  if (first == 0 && last == n) return b;
  const int64_t unit = n / shape[0];
  ZAYA_CHECK(first % unit == 0 && last % unit == 0, "elements [", first, ", ", last, ") of ", name,
             " cut a row of its leading dimension (", unit, " elements); a checkpoint chunk needs whole rows");
  b.offsets[0] = first / unit;
  b.shape[0] = (last - first) / unit;
  return b;
}

}  // namespace zaya::optim
