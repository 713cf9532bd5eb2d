// Context parallelism in the model (context_parallel.h): cp = 2 and 4 ranks, run as threads that
// exchange through shared memory, against one model on the whole sequence: the logits of every
// token and every parameter's gradient, on several small random configs, including chunks of one
// and two tokens (the CCA halo then spans two chunks, or a whole chunk). And the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "zaya/core/error.h"
#include "zaya/core/random.h"
#include "zaya/model/context_parallel.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/gemm.h"

namespace zaya::model {
namespace {

Tensor f32_empty(std::initializer_list<int64_t> dims) { return Tensor::empty(Shape(dims), DType::f32); }

// K ranks as K threads: each exchange publishes this rank's buffer, waits for all, reads the
// others' in rank order, and waits again before any buffer may change. Between exchanges a rank
// computes holding `turn`, so one rank computes at a time: the CPU kernels keep per-process
// scratch (packing buffers, thread plans) that one process's ranks never share.
struct SharedExchange {
  explicit SharedExchange(int k) : size(k), sync(k), bufs(static_cast<size_t>(k)) {}
  int size;
  std::barrier<> sync;
  std::mutex turn;
  std::vector<const float*> bufs;
  void wait_all() {  // the barrier, with the turn released while waiting
    turn.unlock();
    sync.arrive_and_wait();
    turn.lock();
  }
};

// The exchanges are deferred: start_* records the buffers and returns at once, and the exchange
// happens when the Exchange is waited (or destroyed), reading send then. So a model that read recv
// before wait() would read stale data and one that wrote send before it would send the wrong data:
// the model tests run the overlapped schedule's buffer discipline through this. Every rank must
// wait its exchanges in the same order (the barriers pair them up), which the model does.
class ThreadGroup final : public ContextGroup {
 public:
  ThreadGroup(SharedExchange& x, int rank) : x_(x), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return x_.size; }
  Exchange start_all_gather(const Tensor& recv, const Tensor& send) override {
    ZAYA_ASSERT(recv.numel() == send.numel() * x_.size);
    return Exchange(std::make_unique<Deferred>(*this, recv, send, false));
  }
  Exchange start_reduce_scatter(const Tensor& recv, const Tensor& send) override {
    ZAYA_ASSERT(send.numel() == recv.numel() * x_.size);
    return Exchange(std::make_unique<Deferred>(*this, recv, send, true));
  }

 private:
  struct Deferred final : Exchange::Impl {
    Deferred(ThreadGroup& g, Tensor recv, Tensor send, bool reduce)
        : g(g), recv(std::move(recv)), send(std::move(send)), reduce(reduce) {}
    ~Deferred() override { wait(); }
    bool test() override { return done; }
    void wait() override {
      if (done) return;
      done = true;
      if (reduce)
        g.reduce_scatter_now(recv, send);
      else
        g.all_gather_now(recv, send);
    }
    ThreadGroup& g;
    Tensor recv, send;
    bool reduce, done = false;
  };
  void all_gather_now(const Tensor& recv, const Tensor& send) {
    const int64_t n = send.numel();
    publish(send);
    for (int j = 0; j < x_.size; ++j)
      std::memcpy(recv.data<float>() + j * n, x_.bufs[static_cast<size_t>(j)], static_cast<size_t>(n) * 4);
    x_.wait_all();
  }
  void reduce_scatter_now(const Tensor& recv, const Tensor& send) {
    const int64_t n = recv.numel();
    publish(send);
    for (int64_t i = 0; i < n; ++i) {
      float sum = 0;
      for (int j = 0; j < x_.size; ++j) sum += x_.bufs[static_cast<size_t>(j)][rank_ * n + i];
      recv.data<float>()[i] = sum;
    }
    x_.wait_all();
  }
  void publish(const Tensor& send) {
    x_.bufs[static_cast<size_t>(rank_)] = send.data<float>();
    x_.wait_all();
  }
  SharedExchange& x_;
  int rank_;
};

struct CpCase {
  int64_t H, nq, nkv, hd, E, B, S;
  uint64_t seed;
};

ModelConfig config_of(const CpCase& s) {
  ModelConfig c;
  c.vocab_size = 29;
  c.hidden_size = s.H;
  c.num_hidden_layers = 2;
  c.num_attention_heads = s.nq;
  c.num_key_value_heads = s.nkv;
  c.head_dim = s.hd;
  c.num_experts = s.E;
  c.moe_intermediate_size = 8;
  c.router_hidden_size = 8;
  c.max_position_embeddings = 64;
  return c;
}

// Init, then every parameter off its trivial value, so that the conv taps, temperatures and scales
// all reach the loss (the same on every rank: seeded by parameter index).
void randomize(ZayaModel& m, uint64_t seed) {
  m.init(seed);
  for (size_t i = 0; i < m.specs().size(); ++i) {
    Tensor t = m.param(static_cast<int>(i));
    const ParamSpec& s = m.specs()[i];
    if (s.shape.ndim() >= 2)
      fill_normal(t, seed + 1000 + i, 0, 0.0f,
                  1.0f / std::sqrt(static_cast<float>(s.shape[s.shape.ndim() - 1])));
    else if (s.init == InitKind::zeros)
      fill_normal(t, seed + 1000 + i, 0, 0.0f, 0.1f);
    else
      fill_uniform(t, seed + 1000 + i, 0, 0.6f, 1.4f);
  }
}

struct CpRun {
  std::vector<float> logits;  // [B·S, V] in sequence order
  std::vector<float> grads;   // the flat gradient (summed over the ranks, weighted, see below)
  double loss = 0;
};

// ids and targets [B, S] from rows of S + 1 tokens (as the loader packs them): every target
// counts, so every rank's part holds the same number.
void make_batch(const CpCase& s, int64_t V, std::vector<int32_t>& ids, std::vector<int32_t>& targets) {
  Tensor u = f32_empty({s.B * (s.S + 1)});
  fill_uniform(u, s.seed + 99, 0);
  std::vector<int32_t> row(static_cast<size_t>(s.B * (s.S + 1)));
  for (size_t i = 0; i < row.size(); ++i)
    row[i] = static_cast<int32_t>(u.data<float>()[i] * static_cast<float>(V - 1));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < s.S; ++t) {
      ids.push_back(row[static_cast<size_t>(b * (s.S + 1) + t)]);
      targets.push_back(row[static_cast<size_t>(b * (s.S + 1) + t + 1)]);
    }
}

// One model on the whole sequence (cp = 0) or `cp` threads on their zigzag parts. A rank's
// gradient is its part of the gradient of Σ_r loss_r (ZayaModel::set_context_parallel); with equal
// token counts Σ_r loss_r = cp × the whole batch's mean loss, so (1/cp) Σ_r grad_r is the gradient
// one model computes, and the mean of the ranks' losses its loss.
// `setup` (if any) runs on each model after its weights are set (precision options).
CpRun run(const CpCase& s, int cp, CpSchedule schedule = CpSchedule::overlapped,
          const std::function<void(ZayaModel&)>& setup = {}) {
  const ModelConfig cfg = config_of(s);
  std::vector<int32_t> ids, targets;
  make_batch(s, cfg.vocab_size, ids, targets);
  const int64_t V = cfg.vocab_size;
  CpRun out;
  out.logits.assign(static_cast<size_t>(s.B * s.S * V), 0.0f);
  if (cp == 0) {
    ZayaModel m(cfg, s.B, s.S);
    randomize(m, s.seed);
    if (setup) setup(m);
    Tensor tid = Tensor::borrow(ids.data(), {s.B, s.S}, DType::i32),
           ttg = Tensor::borrow(targets.data(), {s.B, s.S}, DType::i32);
    Tensor logits = Tensor::borrow(out.logits.data(), {s.B * s.S, V}, DType::f32);
    m.forward_logits(tid, logits);
    out.loss = m.forward(tid, ttg);
    m.backward();
    out.grads.assign(m.grads_flat().data<float>(), m.grads_flat().data<float>() + m.grads_flat().numel());
    return out;
  }
  SharedExchange x(cp);
  std::vector<std::vector<float>> grads(static_cast<size_t>(cp));
  std::vector<double> losses(static_cast<size_t>(cp));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(cp));
  std::vector<std::thread> threads;
  for (int r = 0; r < cp; ++r)
    threads.emplace_back([&, r] {
      const std::lock_guard<std::mutex> turn(x.turn);  // released only while waiting for the others
      try {
        ThreadGroup g(x, r);
        ZayaModel m(cfg, s.B, s.S);
        randomize(m, s.seed);
        if (setup) setup(m);
        m.set_context_parallel(&g, schedule);
        const int64_t T = m.local_seq_len(), c = T / 2;
        std::vector<int32_t> lid(static_cast<size_t>(s.B * T)), ltg(static_cast<size_t>(s.B * T));
        Tensor tid = Tensor::borrow(lid.data(), {s.B, T}, DType::i32),
               ttg = Tensor::borrow(ltg.data(), {s.B, T}, DType::i32);
        zigzag_select(tid, Tensor::borrow(ids.data(), {s.B, s.S}, DType::i32), r, cp);
        zigzag_select(ttg, Tensor::borrow(targets.data(), {s.B, s.S}, DType::i32), r, cp);
        Tensor logits = f32_empty({s.B * T, V});
        m.forward_logits(tid, logits);
        for (int64_t b = 0; b < s.B; ++b)
          for (int64_t seg = 0; seg < 2; ++seg)
            std::memcpy(out.logits.data() + (b * s.S + zigzag_chunk(r, seg, cp) * c) * V,
                        logits.data<float>() + (b * T + seg * c) * V, static_cast<size_t>(c * V) * 4);
        losses[static_cast<size_t>(r)] = m.forward(tid, ttg);
        m.backward();
        grads[static_cast<size_t>(r)].assign(m.grads_flat().data<float>(),
                                             m.grads_flat().data<float>() + m.grads_flat().numel());
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  out.grads.assign(grads[0].size(), 0.0f);
  for (int r = 0; r < cp; ++r) {
    const double w = 1.0 / cp;
    out.loss += w * losses[static_cast<size_t>(r)];
    for (size_t i = 0; i < out.grads.size(); ++i)
      out.grads[i] += static_cast<float>(w * grads[static_cast<size_t>(r)][i]);
  }
  return out;
}

class ContextParallel : public ::testing::TestWithParam<std::tuple<CpCase, int>> {};

// fp32 throughout: the cp ranks compute the same math in other summation orders (attention over
// gathered keys row by row, the conv's weight gradients split over chunks, the rank-weighted sum
// of gradients here), so results agree to a few ulps relative to each tensor's largest element.
// 1e-5 relative is the bound; a wrong halo or position is off by O(1).
// max |a − b| over max |a| per parameter (and over the logits), with the name of the worst.
struct Worst {
  float rel = 0;
  std::string what;
};
Worst worst_relative(const CpCase& s, const CpRun& ref, const CpRun& got) {
  Worst w;
  float lmax = 0, ldiff = 0;
  for (size_t i = 0; i < ref.logits.size(); ++i) {
    lmax = std::max(lmax, std::fabs(ref.logits[i]));
    ldiff = std::max(ldiff, std::fabs(ref.logits[i] - got.logits[i]));
  }
  w = {ldiff / lmax, "logits"};
  ZayaModel layout(config_of(s), 1, 8);
  for (size_t p = 0; p < layout.specs().size(); ++p) {
    const int64_t off = layout.param_offset(static_cast<int>(p)), n = layout.specs()[p].shape.numel();
    float gmax = 0, gdiff = 0;
    for (int64_t i = off; i < off + n; ++i) {
      gmax = std::max(gmax, std::fabs(ref.grads[static_cast<size_t>(i)]));
      gdiff =
          std::max(gdiff, std::fabs(ref.grads[static_cast<size_t>(i)] - got.grads[static_cast<size_t>(i)]));
    }
    const float r = gdiff <= 1e-12f ? 0.0f : gdiff / std::max(gmax, 1e-30f);  // exact zeros stay exact
    if (r > w.rel) w = {r, layout.specs()[p].name};
  }
  return w;
}

// fp32 throughout: the cp ranks compute the same math in other summation orders (attention over
// gathered keys row by row or split at the chunk and merged, the conv's weight gradients split
// over chunks, the rank-weighted sum of gradients here), so results agree to a few ulps relative
// to each tensor's largest element. 1e-5 relative is the bound; a wrong halo or position
// is off by O(1). Both schedules (context_parallel.h, CpSchedule).
TEST_P(ContextParallel, LogitsAndEveryGradientMatchOneRank) {
  const auto [s, cp] = GetParam();
  const CpRun ref = run(s, 0);
  for (const CpSchedule schedule : {CpSchedule::overlapped, CpSchedule::blocking}) {
    SCOPED_TRACE(schedule == CpSchedule::overlapped ? "overlapped" : "blocking");
    const CpRun got = run(s, cp, schedule);
    EXPECT_NEAR(got.loss, ref.loss, 1e-5 * std::fabs(ref.loss));
    const Worst w = worst_relative(s, ref, got);
    EXPECT_LE(w.rel, 1e-5f) << w.what;
  }
}

// The overlapped schedule computes what the blocking one does, up to where the merge regroups the
// softmax sums and dq, dK, dV add their two halves in another order. The logits and loss differ by
// a few fp32 ulps; the gradients of the small parameters (temperatures, router biases: sums over
// every token with cancellation) by more relative to their largest element, as they do between cp
// and one rank: measured up to 3.5e-6 on these configs (each schedule against one rank: up to
// 4.4e-6 and 3.0e-6). The bound is the one-rank bound, 1e-5
// relative, which an exchange waited too late, a half merged twice or a key counted in both halves
// (all O(1)) cannot hide in.
TEST_P(ContextParallel, OverlappedScheduleIsTheBlockingOneWithinRounding) {
  const auto [s, cp] = GetParam();
  const CpRun blocking = run(s, cp, CpSchedule::blocking), overlapped = run(s, cp, CpSchedule::overlapped);
  EXPECT_NEAR(overlapped.loss, blocking.loss, 1e-6 * std::fabs(blocking.loss));
  const Worst w = worst_relative(s, blocking, overlapped);
  EXPECT_LE(w.rel, 1e-5f) << w.what;
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ContextParallel,
    ::testing::Values(std::make_tuple(CpCase{16, 2, 1, 8, 3, 1, 16, 1}, 2),   // chunks of 4
                      std::make_tuple(CpCase{16, 2, 1, 8, 3, 2, 12, 2}, 2),   // chunks of 3, two rows
                      std::make_tuple(CpCase{24, 4, 2, 8, 4, 1, 8, 3}, 2),    // chunks of 2
                      std::make_tuple(CpCase{16, 4, 2, 16, 3, 1, 8, 4}, 4),   // chunks of 1
                      std::make_tuple(CpCase{16, 2, 2, 8, 2, 2, 16, 5}, 4),   // chunks of 2, two rows
                      std::make_tuple(CpCase{24, 4, 1, 8, 3, 1, 24, 6}, 4)),  // chunks of 3
    [](const auto& info) {
      const CpCase& s = std::get<0>(info.param);
      return "cp" + std::to_string(std::get<1>(info.param)) + "_S" + std::to_string(s.S) + "_B" +
             std::to_string(s.B) + "_nq" + std::to_string(s.nq) + "_nkv" + std::to_string(s.nkv);
    });

// bf16 saved activations (gu16, y16, o16, m16, and the sequence ops' z16, qpre16, kpre16, qr16,
// kr16, v16, att16, which each layer's backward widens into shared scratch before the K/V gather,
// the attention's and the conv's backward read them) under context parallelism, with both
// schedules (they gather the K/V at different times): each rank plans its own N = B·S/cp rows, so
// with bf16 GEMMs on every rank the loss and the logits are bitwise those of f32 activations (the
// forward computes from the f32 values), and the gradients differ (the rounded values reached
// them) within the bound test_model_bf16_activations.cc derives, 4·√(20·L)·2⁻⁸ norm-wise per
// parameter (L = 2: 0.099).
TEST(ContextParallelBf16Activations, LossBitwiseAndGradientsWithinTheBoundOfF32Activations) {
  const CpCase s{16, 2, 1, 8, 3, 2, 12, 2};
  auto precision = [](DType activations) {
    return [activations](ZayaModel& m) {
      m.set_gemm_dtype(DType::bf16);
      m.set_activation_dtype(activations);
    };
  };
  for (CpSchedule schedule : {CpSchedule::overlapped, CpSchedule::blocking}) {
    SCOPED_TRACE(schedule == CpSchedule::overlapped ? "overlapped" : "blocking");
    const CpRun f32 = run(s, 2, schedule, precision(DType::f32)), b16 = run(s, 2, schedule, precision(DType::bf16));
    EXPECT_EQ(std::memcmp(&b16.loss, &f32.loss, sizeof(double)), 0) << b16.loss << " vs " << f32.loss;
    EXPECT_EQ(std::memcmp(b16.logits.data(), f32.logits.data(), f32.logits.size() * 4), 0);
    EXPECT_NE(std::memcmp(b16.grads.data(), f32.grads.data(), f32.grads.size() * 4), 0);
    ZayaModel layout(config_of(s), 1, 8);
    const double tol = 4.0 * std::sqrt(20.0 * layout.config().num_hidden_layers) / 256.0;
    for (size_t p = 0; p < layout.specs().size(); ++p) {
      const int64_t off = layout.param_offset(static_cast<int>(p)), n = layout.specs()[p].shape.numel();
      double num = 0, den = 0;
      for (int64_t i = off; i < off + n; ++i) {
        const double a = b16.grads[static_cast<size_t>(i)], b = f32.grads[static_cast<size_t>(i)];
        num += (a - b) * (a - b);
        den += b * b;
      }
      EXPECT_LE(std::sqrt(num / std::max(den, 1e-300)), tol) << layout.specs()[p].name;
    }
  }
}

// The non-blocking forms of the thread group: two exchanges in flight at once, the send buffers
// read when waited (the contract says: untouched until then), the blocking forms as start + wait,
// and an Exchange that is default-made or waited counts as complete.
TEST(ContextGroupStartForms, TwoInFlightCompleteWhenWaitedInOrder) {
  constexpr int K = 3;
  constexpr int64_t n = 4;
  SharedExchange x(K);
  std::vector<std::vector<float>> gathered(K), scattered(K), blocking(K);
  std::vector<std::thread> threads;
  for (int r = 0; r < K; ++r)
    threads.emplace_back([&, r] {
      const std::lock_guard<std::mutex> turn(x.turn);
      ThreadGroup g(x, r);
      Tensor send_g = f32_empty({n}), recv_g = f32_empty({K * n}), send_s = f32_empty({K * n}),
             recv_s = f32_empty({n});
      for (int64_t i = 0; i < n; ++i) send_g.data<float>()[i] = static_cast<float>(100 * r + i);
      for (int64_t i = 0; i < K * n; ++i) send_s.data<float>()[i] = static_cast<float>(r + 1) * static_cast<float>(i);
      Exchange a = g.start_all_gather(recv_g, send_g), b = g.start_reduce_scatter(recv_s, send_s);
      EXPECT_TRUE(a.pending());
      a.wait();
      b.wait();
      EXPECT_TRUE(a.test());
      EXPECT_TRUE(Exchange().test());
      gathered[static_cast<size_t>(r)].assign(recv_g.data<float>(), recv_g.data<float>() + K * n);
      scattered[static_cast<size_t>(r)].assign(recv_s.data<float>(), recv_s.data<float>() + n);
      g.all_gather(recv_g, send_g);  // the blocking form: the same result
      blocking[static_cast<size_t>(r)].assign(recv_g.data<float>(), recv_g.data<float>() + K * n);
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < K; ++r) {
    for (int j = 0; j < K; ++j)
      for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(gathered[static_cast<size_t>(r)][static_cast<size_t>(j * n + i)], static_cast<float>(100 * j + i));
    // Σ_j (j + 1)·(r·n + i) = 6·(r·n + i) for K = 3
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(scattered[static_cast<size_t>(r)][static_cast<size_t>(i)], 6.0f * static_cast<float>(r * n + i));
    EXPECT_EQ(blocking[static_cast<size_t>(r)], gathered[static_cast<size_t>(r)]);
  }
}

// A group that is never asked to exchange: enough for the checks before any forward.
class IdleGroup final : public ContextGroup {
 public:
  explicit IdleGroup(int k) : k_(k) {}
  int rank() const override { return 0; }
  int size() const override { return k_; }
  Exchange start_all_gather(const Tensor&, const Tensor&) override {
    ADD_FAILURE() << "no exchange expected";
    return {};
  }
  Exchange start_reduce_scatter(const Tensor&, const Tensor&) override {
    ADD_FAILURE() << "no exchange expected";
    return {};
  }

 private:
  int k_;
};

TEST(ContextParallelErrors, ASequenceThatDoesNotSplitNamesParallelCpAndTheLength) {
  ZayaModel m(config_of(CpCase{16, 2, 1, 8, 3, 1, 10, 1}), 1, 10);
  IdleGroup g(4);
  try {
    m.set_context_parallel(&g);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("parallel.cp = 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("10 tokens"), std::string::npos) << msg;
  }
  EXPECT_THROW(zigzag_chunk_len(6, 4), Error);  // more ranks than the tokens split over: 8 chunks of 6
  EXPECT_EQ(zigzag_chunk_len(8, 4), 1);
}

TEST(ContextParallelLayout, ZigzagSelectAndPlaceAreInverse) {
  std::vector<int32_t> rows(2 * 16), back(rows.size(), -1);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int32_t>(i);
  Tensor trows = Tensor::borrow(rows.data(), {2, 16}, DType::i32),
         tback = Tensor::borrow(back.data(), {2, 16}, DType::i32);
  for (int r = 0; r < 4; ++r) {
    std::vector<int32_t> part(2 * 4);
    Tensor tpart = Tensor::borrow(part.data(), {2, 4}, DType::i32);
    zigzag_select(tpart, trows, r, 4);
    // Rank r holds chunks r and 7 − r (of 2 tokens) of each row.
    EXPECT_EQ(part[0], 2 * r);
    EXPECT_EQ(part[2], 2 * (7 - r));
    EXPECT_EQ(part[4], 16 + 2 * r);
    zigzag_place(tback, tpart, r, 4);
  }
  EXPECT_EQ(back, rows);
}

}  // namespace
}  // namespace zaya::model
