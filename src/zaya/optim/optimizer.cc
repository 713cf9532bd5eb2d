#include "zaya/optim/optimizer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "zaya/core/log.h"
#include "zaya/core/threads.h"
#include "zaya/ops/optim_ops.h"
#include "zaya/optim/muon.h"
#include "zaya/optim/shard_plan.h"

namespace zaya::optim {
namespace {

DType ns_dtype(const OptimizerConfig& c) { return c.muon_ns_bf16 ? DType::bf16 : DType::f32; }

// One thread's share of the side-by-side scratch, rounded to 16 floats so that threads' windows
// start on their own cache lines.
int64_t per_thread_scratch(int64_t per_matrix) { return (per_matrix + 15) / 16 * 16; }

}  // namespace

Optimizer::Optimizer(const OptimizerConfig& config, const ParamTable& table, ShardRange range)
    : cfg_(config), table_(table), range_(range) {
  cfg_.validate("Optimizer");
  table_.validate("Optimizer");
  const int64_t P = table_.numel();
  if (range_.end < 0) range_.end = P;
  ZAYA_CHECK(0 <= range_.begin && range_.begin <= range_.end && range_.end <= P, "Optimizer: shard range [",
             range_.begin, ", ", range_.end, ") is not inside the ", P, "-element parameter buffer");
  ZAYA_CHECK(table_.params_begin <= range_.begin && range_.end <= table_.params_begin + table_.params.numel(),
             "Optimizer: the parameters it updates, flat elements [", table_.params_begin, ", ",
             table_.params_begin + table_.params.numel(), "), do not hold its shard range [", range_.begin, ", ",
             range_.end, ")");
  const std::vector<model::ParamSpec>& specs = table_.specs;
  int64_t n_adamw = 0, scratch = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    groups_.push_back(group_of(specs[i], cfg_));
    const ParamGroup& g = groups_.back();
    const Owned o = owned(i);
    if (g.group == Group::adamw) {
      v_offset_.push_back(n_adamw);
      n_adamw += o.last - o.first;
      continue;
    }
    v_offset_.push_back(-1);
    if (!o.any()) continue;
    // Each matrix of the parameter (an expert stack has g.count) is owned whole or not at all.
    const int64_t per = g.rows * g.cols;
    for (int64_t e = 0; e < g.count; ++e) {
      const int64_t m0 = e * per, m1 = m0 + per;
      const bool in = o.first <= m0 && m1 <= o.last, out = m1 <= o.first || o.last <= m0;
      ZAYA_CHECK(in || out, "Optimizer: shard range [", range_.begin, ", ", range_.end, ") cuts Muon matrix ",
                 specs[i].name, g.count > 1 ? str(" [expert ", e, "]") : std::string(), " (elements [",
                 table_.offsets[i] + m0, ", ", table_.offsets[i] + m1,
                 ")); a Muon matrix needs a whole owner (move the range to a matrix boundary)");
      if (in) muon_items_.push_back({static_cast<int>(i), e, newton_schulz_flops(g.rows, g.cols)});
    }
    stack_scratch_ = std::max(stack_scratch_, muon_scratch_elems(g.rows, g.cols, g.count, ns_dtype(cfg_)));
    per_matrix_scratch_ = std::max(per_matrix_scratch_, muon_scratch_elems(g.rows, g.cols, 1, ns_dtype(cfg_)));
  }
  // Largest first, ties in parameter order: the side-by-side loop hands them out in this order.
  std::stable_sort(muon_items_.begin(), muon_items_.end(),
                   [](const MuonItem& a, const MuonItem& b) { return a.flops > b.flops; });
  summary_ = summarize_groups(specs, cfg_);
  // The state lives with the parameters (on the GPU when they are there); the step counters,
  // which checkpoints store as tensors, on the host.
  const Device dev = device();
  moment1_ = Tensor::zeros(Shape{std::max<int64_t>(range_.end - range_.begin, 1)}, DType::f32, dev);
  adam_v_ = Tensor::zeros(Shape{std::max<int64_t>(n_adamw, 1)}, DType::f32, dev);
  scratch = muon_scratch_need(num_threads());
  if (scratch > 0) scratch_ = Tensor::zeros(Shape{scratch}, DType::f32, dev);
  step_t_ = Tensor::zeros(Shape{1}, DType::i64);
  balance_step_t_ = Tensor::zeros(Shape{1}, DType::i64);
  const Tensor& beta = table_.balancing_biases;
  ZAYA_CHECK(!cfg_.balance_enabled || (beta.defined() && beta.ndim() == 2 && beta.size(1) >= 2),
             "Optimizer: the expert-balance controller needs balancing biases [L, E+1] in the parameter table, found ",
             beta.defined() ? beta.str() : std::string("none"));
  if (beta.defined())
    balancer_ = BalanceController(beta.size(0), beta.size(1) - 1, cfg_.balance_lr, cfg_.balance_beta1,
                                  cfg_.balance_beta2, cfg_.balance_eps, beta.device());
  log_debug(summary_.str());  // the trainer's summary prints it once, as "optimizer: ..."
  log_info("optimizer state: ", state_bytes(), " bytes (", cfg_.muon ? "muon + adamw" : "adamw only",
           ", muon scratch ", scratch * 4, " bytes",
           range_.begin == 0 && range_.end == P ? std::string()
                                                : str(", elements [", range_.begin, ", ", range_.end, ") of ", P),
           ")");
}

Optimizer::Owned Optimizer::owned(size_t i) const {
  const int64_t off = table_.offsets[i], n = table_.specs[i].shape.numel();
  Owned o{std::clamp<int64_t>(range_.begin - off, 0, n), std::clamp<int64_t>(range_.end - off, 0, n)};
  o.whole = o.first == 0 && o.last == n;
  return o;
}

Tensor Optimizer::moment1(size_t i, const Owned& o) const {
  const int64_t at = table_.offsets[i] + o.first - range_.begin;
  return o.whole ? moment1_.window(at, table_.specs[i].shape) : moment1_.window(at, Shape{o.last - o.first});
}

size_t Optimizer::state_bytes() const {
  return moment1_.nbytes() + adam_v_.nbytes() + (scratch_.defined() ? scratch_.nbytes() : 0) +
         balancer_.m().nbytes() + balancer_.v().nbytes();
}

StepStats Optimizer::step(double lr) {
  ZAYA_CHECK(std::isfinite(lr) && lr >= 0, "Optimizer::step: learning rate must be finite and >= 0, found ",
             lr);
  StepStats s;
  s.lr = lr;
  const bool full = range_.begin == 0 && range_.end == table_.numel();
  const Tensor grads = full ? table_.grads : table_.grads.window(range_.begin, Shape{range_.end - range_.begin});
  std::span<const Tensor> mine(&grads, 1);
  if (!sum_across_ranks_) {
    s.grad_norm = cfg_.grad_clip > 0 ? ops::clip_grad_norm(mine, cfg_.grad_clip) : ops::global_grad_norm(mine);
  } else {
    // The global norm from every shard's part, then PyTorch's clip_grad_norm_ rule on this shard.
    const double local = ops::global_grad_norm(mine);
    s.grad_norm = std::sqrt(sum_across_ranks_(local * local));
    if (cfg_.grad_clip > 0 && std::isfinite(s.grad_norm)) {
      const double f = cfg_.grad_clip / (s.grad_norm + 1e-6);
      if (f < 1.0) ops::scale_inplace(grads, static_cast<float>(f));
    }
  }
  s.clipped = cfg_.grad_clip > 0 && s.grad_norm + 1e-6 > cfg_.grad_clip;
  if (!std::isfinite(s.grad_norm)) {
    log_warn("optimizer: non-finite gradient norm ", s.grad_norm, " at step ", step_ + 1, ": update skipped");
    s.skipped = true;
    s.step = step_;
    table_.grads.zero_();
    return s;
  }
  s.step = ++step_;

  ops::AdamWHyper ah;
  ah.lr = static_cast<float>(lr);
  ah.beta1 = static_cast<float>(cfg_.beta1);
  ah.beta2 = static_cast<float>(cfg_.beta2);
  ah.eps = static_cast<float>(cfg_.eps);
  MuonHyper mh;
  mh.lr = static_cast<float>(lr);
  mh.momentum = static_cast<float>(cfg_.muon_momentum);
  mh.ns_steps = static_cast<int>(cfg_.muon_ns_steps);
  mh.ns_dtype = ns_dtype(cfg_);
  // Every parameter's update reads and writes only its own state, so the order among parameters
  // does not change a bit; within each, every run applies the same float operations in the same order.
  const int threads = num_threads();
  const bool side_by_side = muon_side_by_side(threads);
  if (scratch_.numel() < muon_scratch_need(threads)) {  // the thread count changed since construction
    log_debug("optimizer: muon scratch grows to ", muon_scratch_need(threads) * 4, " bytes for ", threads,
              " threads");
    scratch_ = Tensor::zeros(Shape{muon_scratch_need(threads)}, DType::f32, device());
  }
  for (size_t i = 0; i < table_.specs.size(); ++i) {
    const ParamGroup& g = groups_[i];
    const Owned o = owned(i);
    if (!o.any()) continue;
    const float wd = g.weight_decay ? static_cast<float>(cfg_.weight_decay) : 0.0f;
    const Tensor m = moment1(i, o);
    if (g.group == Group::adamw) {
      ah.weight_decay = wd;
      const bool all = o.whole;
      const Shape n{o.last - o.first};
      const int64_t at = table_.offsets[i] + o.first;
      ops::adamw_update(all ? table_.param(i) : table_.param_window(at, n),
                        m, adam_v_.window(v_offset_[i], all ? table_.specs[i].shape : n),
                        all ? table_.grad(i) : table_.grads.window(at, n), ah, step_);
    } else if (!side_by_side) {
      mh.weight_decay = wd;
      if (o.whole) {
        muon_update_stack(table_.param(i), table_.grad(i), m, scratch_, mh);
      } else {  // the owned matrices of an expert stack, one by one
        for (const MuonItem& it : muon_items_)
          if (static_cast<size_t>(it.param) == i)
            muon_update_stack(table_.param_window(table_.offsets[i] + it.matrix * g.rows * g.cols, Shape{g.rows, g.cols}),
                              table_.grad(i).select(it.matrix),
                              moment1_.window(table_.offsets[i] - range_.begin + it.matrix * g.rows * g.cols,
                                              Shape{g.rows, g.cols}),
                              scratch_, mh);
      }
    }
  }
  if (side_by_side) muon_matrices_side_by_side(mh, threads);
  table_.grads.zero_();
  return s;
}

bool Optimizer::muon_side_by_side(int threads) const {
  // A CPU schedule: on a GPU every matrix's passes and GEMMs already fill the device.
  return device() == Device::cpu && !muon_items_.empty() && static_cast<int64_t>(muon_items_.size()) >= threads;
}

int64_t Optimizer::muon_scratch_need(int threads) const {
  return muon_side_by_side(threads) ? threads * per_thread_scratch(per_matrix_scratch_) : stack_scratch_;
}

// Muon's matrices (an expert stack's one by one) shared out among the threads as they free up,
// largest first, each run whole on the thread that takes it: momentum, Newton–Schulz with
// one-thread GEMMs, update. No barrier falls between a matrix's 15 GEMMs and its passes, and each
// matrix's working set stays in its core's caches: the demo's optimizer step read 0.50–0.77× of
// one all-thread call per parameter, six alternated pairs of runs on two cores (docs/optim.md,
// "Muon's matrices side by side"). A matrix's result does not depend on the thread that runs it, so
// the step is bitwise the same on any thread count that takes this path (one included).
void Optimizer::muon_matrices_side_by_side(MuonHyper mh, int threads) {
  const int64_t share = per_thread_scratch(per_matrix_scratch_);
  const int64_t n_items = static_cast<int64_t>(muon_items_.size());
#pragma omp parallel num_threads(threads)
  {
    const Tensor scratch = scratch_.window(omp_get_thread_num() * share, Shape{share});
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < n_items; ++k) {
      const MuonItem& it = muon_items_[static_cast<size_t>(k)];
      const size_t i = static_cast<size_t>(it.param);
      const ParamGroup& g = groups_[i];
      const Shape& shape = table_.specs[i].shape;
      MuonHyper h = mh;
      h.weight_decay = g.weight_decay ? static_cast<float>(cfg_.weight_decay) : 0.0f;
      // This matrix alone: a shard may own only some of an expert stack's matrices.
      const int64_t per = g.rows * g.cols;
      const Shape one = shape.ndim() == 3 ? Shape{g.rows, g.cols} : shape;
      Tensor p = table_.param_window(table_.offsets[i] + it.matrix * per, one), gr = table_.grad(i);
      Tensor m = moment1_.window(table_.offsets[i] + it.matrix * per - range_.begin, one);
      if (shape.ndim() == 3) gr = gr.select(it.matrix);
      muon_update_on_this_thread(p, gr, m, scratch, h);
    }
  }
}

void Optimizer::balance_step(std::span<const int64_t> counts, double lr) {
  if (!cfg_.balance_enabled) return;
  double scale = 1.0;
  if (cfg_.balance_follow_schedule) {
    ZAYA_CHECK(lr >= 0, "Optimizer::balance_step: optim.balance_follow_schedule needs the step's learning rate");
    scale = cfg_.lr > 0 ? lr / cfg_.lr : 0.0;
  }
  balancer_.step(table_.balancing_biases, counts, scale);
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state_tensors() {
  for (size_t i = 0; i < table_.specs.size(); ++i)
    ZAYA_CHECK(owned(i).whole || !owned(i).any(), "Optimizer::state_tensors: the shard range [", range_.begin, ", ",
               range_.end, ") cuts parameter ", table_.specs[i].name,
               "; checkpoints of cut parameters come with ZeRO-1's sharded state (state_parts)");
  // With every owned parameter whole, each part is its whole tensor.
  std::vector<std::pair<std::string, Tensor>> out;
  for (StatePart& p : state_parts()) out.emplace_back(std::move(p.name), std::move(p.tensor));
  return out;
}

std::vector<Optimizer::StatePart> Optimizer::state_parts() {
  step_t_.data<int64_t>()[0] = step_;
  balance_step_t_.data<int64_t>()[0] = balancer_.steps();
  std::vector<StatePart> out;
  auto whole = [](const std::string& name, const Tensor& t) {
    return StatePart{name, t, std::vector<int64_t>(t.shape().begin(), t.shape().end()),
                     std::vector<int64_t>(static_cast<size_t>(t.ndim()), 0), /*replicated=*/true};
  };
  out.push_back(whole("optim.step", step_t_));
  out.push_back(whole("optim.balance_step", balance_step_t_));
  for (size_t i = 0; i < table_.specs.size(); ++i) {
    const Owned o = owned(i);
    if (!o.any()) continue;
    const model::ParamSpec& spec = table_.specs[i];
    // The owned elements as whole rows of the leading dimension: a checkpoint chunk.
    RowBox box = row_box(spec.shape, o.first, o.last, spec.name);
    const Shape part = Shape::of(box.shape);
    const int64_t at = table_.offsets[i] + o.first - range_.begin;
    if (groups_[i].group == Group::adamw) {
      out.push_back({spec.name + ".adam_m", moment1_.window(at, part), box.global, box.offsets, false});
      out.push_back({spec.name + ".adam_v", adam_v_.window(v_offset_[i], part), box.global, box.offsets, false});
    } else {
      out.push_back({spec.name + ".muon_momentum", moment1_.window(at, part), box.global, box.offsets, false});
    }
  }
  for (int64_t l = 0; l < balancer_.m().size(0); ++l) {
    const std::string b = model::balancing_bias_name(static_cast<int>(l));
    out.push_back(whole(b + ".adam_m", balancer_.m().select(l)));
    out.push_back(whole(b + ".adam_v", balancer_.v().select(l)));
  }
  return out;
}

void Optimizer::state_parts_loaded() {
  const int64_t step = step_t_.data<int64_t>()[0], balance = balance_step_t_.data<int64_t>()[0];
  ZAYA_CHECK(step >= 0 && balance >= 0, "optimizer state: negative step counter (optim.step ", step,
             ", optim.balance_step ", balance, ")");
  step_ = step;
  balancer_.set_steps(balance);
}

void Optimizer::load_state(const std::map<std::string, Tensor>& state) {
  // Validate everything before copying anything, so a bad checkpoint leaves the state intact.
  std::vector<std::pair<std::string, Tensor>> mine = state_tensors();
  for (const auto& [name, dst] : mine) {
    auto it = state.find(name);
    ZAYA_CHECK(it != state.end(), "optimizer state: tensor '", name,
               "' missing (was the checkpoint written with a different optim.muon / grouping config?)");
    check_dtype(str("optimizer state '", name, "'"), it->second, dst.dtype());
    check_shape(str("optimizer state '", name, "'"), it->second, dst.shape());
  }
  for (auto& [name, dst] : mine) {
    const Tensor& src = state.at(name);
    dst.copy_from(src.device() == Device::cpu ? src : src.to(Device::cpu));
  }
  state_parts_loaded();  // the counters
}

}  // namespace zaya::optim
