#include "zaya/train/grad_sync.h"

#include <algorithm>
#include <cstdio>

#include "zaya/core/cuda_context.h"
#include "zaya/core/error.h"
#include "zaya/ops/grad_wire.h"
#include "zaya/ops/optim_ops.h"

namespace zaya::train {
namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

DType wire_dtype(GradReduce m) {
  switch (m) {
    case GradReduce::f32: return DType::f32;
    case GradReduce::bf16: return DType::bf16;
    case GradReduce::f64: return DType::f64;
  }
  return DType::f32;
}
}  // namespace

GradReduce parse_grad_reduce(const std::string& name, const std::string& field) {
  if (name == "f32") return GradReduce::f32;
  if (name == "bf16") return GradReduce::bf16;
  if (name == "f64") return GradReduce::f64;
  throw Error(str(field, " must be \"f32\", \"bf16\" or \"f64\", found \"", name, "\""));
}

const char* grad_reduce_name(GradReduce r) {
  switch (r) {
    case GradReduce::f32: return "f32";
    case GradReduce::bf16: return "bf16";
    case GradReduce::f64: return "f64";
  }
  return "?";
}

GradientSync::GradientSync(dist::Communicator& dp, const optim::ShardPlan& plan, const Tensor& params,
                           const Tensor& grads, std::vector<std::pair<int64_t, int64_t>> ready_order,
                           GradReduce mode, int64_t bucket_elements)
    : dp_(dp), plan_(plan), params_(params), grads_(grads), mode_(mode), order_(std::move(ready_order)) {
  const int64_t P = grads_.numel();
  ZAYA_CHECK((params_.dtype() == DType::f32 || params_.dtype() == DType::bf16) && grads_.dtype() == DType::f32 &&
                 params_.numel() == P && params_.ndim() == 1 && grads_.ndim() == 1,
             "GradientSync: parameters ", params_.str(), " (f32 or bf16) and gradients ", grads_.str(),
             " (f32) must be flat buffers of one size");
  ZAYA_CHECK(static_cast<int>(plan_.ranks.size()) == dp_.size() && plan_.numel == P, "GradientSync: a plan for ",
             plan_.ranks.size(), " ranks over ", plan_.numel, " elements, but ", dp_.size(), " ranks over ", P);
  ZAYA_CHECK(bucket_elements > 0, "GradientSync: bucket size must be positive, found ", bucket_elements);
  // The reports must tile the buffer, or some gradient would never be reduced.
  std::vector<std::pair<int64_t, int64_t>> sorted = order_;
  std::sort(sorted.begin(), sorted.end());
  int64_t at = 0;
  for (const auto& [b, e] : sorted) {
    ZAYA_CHECK(b == at && e >= b, "GradientSync: the model's gradient reports do not tile its buffer: a range [", b,
               ", ", e, ") where element ", at, " was expected");
    at = e;
  }
  ZAYA_CHECK(at == P, "GradientSync: the model's gradient reports end at ", at, ", its buffer at ", P);
  buckets_ = dist::plan_buckets(order_, bucket_elements);
  if (mode_ == GradReduce::f64) wide_ = Tensor::zeros(Shape{P}, DType::f64, grads_.device());
  if (mode_ == GradReduce::bf16)
    wire_ = Tensor::zeros(Shape{P}, DType::bf16, grads_.device());
  // A device communicator's gathers are waited for by the compute stream: two timing events per
  // bucket measure that wait.
  if (dp_.device() == Device::cuda && !cuda::emulated())
    for (size_t i = 0; i < 2 * buckets_.size(); ++i) stall_events_.push_back(std::make_unique<cuda::Event>());
}

std::vector<size_t> GradientSync::counts_of(int64_t begin, int64_t end) const {
  std::vector<size_t> counts;
  for (const optim::RankShare& s : plan_.ranks)
    counts.push_back(static_cast<size_t>(std::max<int64_t>(0, std::min(end, s.end) - std::max(begin, s.begin))));
  return counts;
}

model::ZayaModel::GradReadyFn GradientSync::ready_fn(bool last) {
  next_report_ = 0;
  if (last) {
    next_bucket_ = 0;
    flights_.clear();
    blocked_s_ = 0;
    // The step's record keeps the parameter gather its forward used.
    const double gather_s = times_.gather_s, gather_exposed_s = times_.gather_exposed_s;
    times_ = {};
    times_.gather_s = gather_s;
    times_.gather_exposed_s = gather_exposed_s;
  }
  // The backward reads every parameter (on a device the kernels wait for the gather; the host
  // completes it in finish()).
  need_params(0, params_.numel());
  return [this, last](int64_t begin, int64_t end) { on_ready(begin, end, last); };
}

void GradientSync::on_ready(int64_t begin, int64_t end, bool last) {
  while (next_report_ < order_.size() && order_[next_report_].first == order_[next_report_].second) ++next_report_;
  ZAYA_CHECK(next_report_ < order_.size() && order_[next_report_] == std::make_pair(begin, end),
             "GradientSync: backward reported gradients [", begin, ", ", end, ") out of the order its ready_order() gave");
  if (mode_ == GradReduce::f64)
    ops::accumulate_wide(wide_.window(begin, Shape{end - begin}), grads_.window(begin, Shape{end - begin}));
  if (last) {
    poll();  // MPI progresses non-blocking collectives only inside MPI calls
    while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].last_report == next_report_)
      start_bucket(buckets_[next_bucket_++]);
  }
  ++next_report_;
}

void GradientSync::start_bucket(const dist::Bucket& b) {
  const int64_t n = b.end - b.begin;
  Tensor buf = grads_;
  if (mode_ == GradReduce::f64) buf = wide_;
  if (mode_ == GradReduce::bf16) {
    buf = wire_;
    ops::to_bf16_wire(wire_.window(b.begin, Shape{n}), grads_.window(b.begin, Shape{n}));
  }
  const std::vector<size_t> counts = counts_of(b.begin, b.end);
  size_t before = 0;
  for (int r = 0; r < dp_.rank(); ++r) before += counts[static_cast<size_t>(r)];
  const size_t es = dtype_size(buf.dtype());
  std::byte* send = static_cast<std::byte*>(buf.raw()) + static_cast<size_t>(b.begin) * es;
  InFlight f;
  f.issued = Clock::now();
  f.work = dp_.start_reduce_scatter_v(send, send + before * es, counts, buf.dtype());
  blocked_s_ += seconds(f.issued, Clock::now());  // an MPI start may do part of the work before returning
  flights_.push_back(std::move(f));
  ++times_.buckets;
}

void GradientSync::poll() {
  const auto t0 = Clock::now();
  for (InFlight& f : flights_)
    if (!f.complete && f.work.test()) {
      f.complete = true;
      f.done = Clock::now();
    }
  if (gathers_on_device_ > 0) poll_gathers();
  blocked_s_ += seconds(t0, Clock::now());
}

void GradientSync::end_backward(bool last) {
  while (next_report_ < order_.size() && order_[next_report_].first == order_[next_report_].second) ++next_report_;
  ZAYA_CHECK(next_report_ == order_.size(), "GradientSync: backward ended after ", next_report_, " of ",
             order_.size(), " gradient reports");
  if (last) {
    ZAYA_CHECK(next_bucket_ == buckets_.size(), "GradientSync: ", buckets_.size() - next_bucket_,
               " buckets were never started");
    backward_end_ = Clock::now();
  }
}

void GradientSync::finish(int64_t micro_batches_total) {
  ZAYA_CHECK(micro_batches_total > 0, "GradientSync::finish: micro-batch count must be positive, found ",
             micro_batches_total);
  // The gathers the forward left to the device, first: they were issued before the buckets, so a
  // hung one is named as what it is. The buckets follow them on the communicator's stream, so
  // this wait is part of waiting for the buckets (counted in exposed_s below); the gathers' own
  // exposure is the compute stream's wait, read once the buckets are in (by then the stream has
  // passed the forward, where it waited).
  if (gathers_on_device_ > 0) complete_gathers();
  for (InFlight& f : flights_)
    if (!f.complete) {
      f.work.wait();
      f.complete = true;
      f.done = Clock::now();
    }
  if (stalls_unread_ > 0) {
    read_stalls();
    times_.gather_exposed_s = gather_waited_s_ + gather_stalled_s_;
  }
  const auto all_done = Clock::now();
  // In flight: the union of the bucket spans. Exposed: what the step waited for them after
  // backward, plus the time backward spent inside the communicator's calls (a start or a test may
  // do part of a collective's work before it returns). Hidden: the rest of the time in flight.
  std::vector<std::pair<Clock::time_point, Clock::time_point>> spans;
  for (const InFlight& f : flights_) spans.emplace_back(f.issued, f.done);
  std::sort(spans.begin(), spans.end());
  Clock::time_point cur_b{}, cur_e{};
  bool have = false;
  for (const auto& [b, e] : spans) {
    if (have && b <= cur_e) {
      cur_e = std::max(cur_e, e);
      continue;
    }
    if (have) times_.comm_s += seconds(cur_b, cur_e);
    cur_b = b, cur_e = e, have = true;
  }
  if (have) times_.comm_s += seconds(cur_b, cur_e);
  times_.exposed_s = std::max(0.0, seconds(backward_end_, all_done)) + blocked_s_;
  times_.comm_s = std::max(times_.comm_s, times_.exposed_s);
  times_.hidden_s = times_.comm_s - times_.exposed_s;

  const optim::RankShare& mine = plan_.ranks[static_cast<size_t>(dp_.rank())];
  const int64_t n = mine.elements();
  const double scale = 1.0 / static_cast<double>(micro_batches_total);
  if (mode_ == GradReduce::f64) {
    // Everything but the owned range holds partial sums: clear it for the next step.
    if (mine.begin > 0) wide_.window(0, Shape{mine.begin}).zero_();
    if (mine.end < wide_.numel()) wide_.window(mine.end, Shape{wide_.numel() - mine.end}).zero_();
    if (n > 0) ops::narrow_scaled(grads_.window(mine.begin, Shape{n}), wide_.window(mine.begin, Shape{n}), scale);
  } else if (mode_ == GradReduce::bf16) {
    if (n > 0)
      ops::from_bf16_wire(grads_.window(mine.begin, Shape{n}), wire_.window(mine.begin, Shape{n}),
                          static_cast<float>(scale));
  } else if (n > 0 && micro_batches_total > 1) {
    ops::scale_inplace(grads_.window(mine.begin, Shape{n}), static_cast<float>(scale));
  }
}

void GradientSync::start_param_gather() {
  settle_params();
  gathers_.clear();
  next_gather_wait_ = 0;
  gathers_done_ = 0;
  gather_waited_s_ = 0;
  gather_stalled_s_ = 0;
  gather_issued_ = Clock::now();
  const size_t es = dtype_size(params_.dtype());
  for (auto it = buckets_.rbegin(); it != buckets_.rend(); ++it) {
    const dist::Bucket& b = *it;
    const std::vector<size_t> counts = counts_of(b.begin, b.end);
    size_t before = 0;
    for (int r = 0; r < dp_.rank(); ++r) before += counts[static_cast<size_t>(r)];
    // In place: this rank's block of the bucket is its own updated elements.
    std::byte* base = static_cast<std::byte*>(params_.raw()) + static_cast<size_t>(b.begin) * es;
    InFlight f;
    f.issued = gather_issued_;
    f.work = dp_.start_all_gather_v(base + before * es, base, counts, params_.dtype());
    gathers_.push_back(std::move(f));
  }
}

void GradientSync::gather_done(size_t g) {
  InFlight& f = gathers_[g];
  f.complete = true;
  f.done = Clock::now();
  if (f.on_device) {
    f.on_device = false;
    --gathers_on_device_;
  }
  if (++gathers_done_ == gathers_.size()) {
    Clock::time_point last = gather_issued_;
    for (const InFlight& x : gathers_) last = std::max(last, x.done);
    times_.gather_s = seconds(gather_issued_, last);
  }
}

void GradientSync::order_gather(size_t g) {
  InFlight& f = gathers_[g];
  if (f.complete || f.on_device) return;
  cuda::Event* before = nullptr;
  if (!stall_events_.empty()) {
    before = stall_events_[2 * g].get();
    before->record_on(cuda::current().stream());
  }
  if (!f.work.wait_on_compute_stream()) {  // the host waited (a host backend, or already complete)
    gather_done(g);
    return;
  }
  f.on_device = true;
  ++gathers_on_device_;
  if (before) {
    stall_events_[2 * g + 1]->record_on(cuda::current().stream());
    f.stall_timed = true;
    ++stalls_unread_;
  }
}

void GradientSync::poll_gathers() {
  for (size_t g = 0; g < gathers_.size(); ++g)
    if (!gathers_[g].complete && gathers_[g].work.test()) gather_done(g);
}

void GradientSync::complete_gathers() {
  for (size_t g = 0; g < gathers_.size(); ++g)
    if (gathers_[g].on_device) {
      gathers_[g].work.wait();
      gather_done(g);
    }
}

void GradientSync::read_stalls() {
  // How long the compute stream stood at each wait: from the kernels before it to its release.
  for (size_t g = 0; g < gathers_.size(); ++g)
    if (gathers_[g].stall_timed) {
      gathers_[g].stall_timed = false;
      --stalls_unread_;
      cuda::Event& after = *stall_events_[2 * g + 1];
      after.synchronize();  // passed already where the step's buckets were waited for
      gather_stalled_s_ += cuda::Event::elapsed_ms(*stall_events_[2 * g], after) / 1e3;
    }
}

void GradientSync::need_params(int64_t begin, int64_t end) {
  if (!params_pending()) return;
  const auto t0 = Clock::now();
  size_t upto = next_gather_wait_;  // the gathers are in forward order: wait through the last that overlaps
  for (size_t g = next_gather_wait_; g < gathers_.size(); ++g) {
    const dist::Bucket& b = buckets_[buckets_.size() - 1 - g];
    if (b.begin < end && begin < b.end) upto = g + 1;
  }
  for (; next_gather_wait_ < upto; ++next_gather_wait_) order_gather(next_gather_wait_);
  // MPI progresses non-blocking collectives only inside MPI calls: the later buckets move on here.
  // On a device this notes which gathers have landed.
  poll_gathers();
  gather_waited_s_ += seconds(t0, Clock::now());
  times_.gather_exposed_s = gather_waited_s_ + gather_stalled_s_;
}

void GradientSync::settle_params() {
  if (!params_pending() && gathers_on_device_ == 0 && stalls_unread_ == 0) return;
  // Those left to the device first, as they were issued first (a hung one is named): their
  // exposure is the compute stream's wait, not this one.
  if (gathers_on_device_ > 0) complete_gathers();
  if (stalls_unread_ > 0) read_stalls();
  // The host's wait: for the gathers nothing waited for yet (all of them without prefetching).
  const auto t0 = Clock::now();
  for (; next_gather_wait_ < gathers_.size(); ++next_gather_wait_) {
    InFlight& f = gathers_[next_gather_wait_];
    if (f.complete) continue;
    f.work.wait();
    gather_done(next_gather_wait_);
  }
  gather_waited_s_ += seconds(t0, Clock::now());
  times_.gather_exposed_s = gather_waited_s_ + gather_stalled_s_;
}

std::string GradientSync::plan_str() const {
  int64_t largest = 0;
  for (const dist::Bucket& b : buckets_) largest = std::max(largest, b.end - b.begin);
  char line[300];
  std::snprintf(line, sizeof line,
                "gradient buckets: %zu over %lld elements (largest %.2f MiB of f32), reduced in %s, parameters "
                "gathered in %s; %.2f MiB sent per rank per step (reduce-scatter + all-gather)",
                buckets_.size(), static_cast<long long>(grads_.numel()), static_cast<double>(largest) * 4 / 1048576.0,
                grad_reduce_name(mode_), std::string(dtype_name(params_.dtype())).c_str(), bytes_per_step() / 1048576.0);
  return line;
}

int64_t GradientSync::buffer_bytes() const {
  return (wide_.defined() ? static_cast<int64_t>(wide_.nbytes()) : 0) +
         (wire_.defined() ? static_cast<int64_t>(wire_.nbytes()) : 0);
}

double GradientSync::bytes_per_step() const {
  const double N = static_cast<double>(dp_.size()), P = static_cast<double>(grads_.numel());
  return (N - 1) / N * P * static_cast<double>(dtype_size(wire_dtype(mode_)) + dtype_size(params_.dtype()));
}

}  // namespace zaya::train
