// `zaya bench step`: times training steps (zero_grad, forward with the loss gradient, backward) of
// a ZAYA1 model on random tokens; benchmarks/model_vs_hf.py, tools/step_ab.py and
// scripts/gpu_check.sh parse its "bench: ..." lines.
#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_vocabulary.h"
#include "commands.h"
#include "model_source.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/error.h"
#include "zaya/core/peak_flops.h"
#include "zaya/core/philox.h"
#include "zaya/core/tensor.h"
#include "zaya/model/params.h"
#include "zaya/model/zaya_model.h"
#include "zaya/ops/cpu/gemm_cpu.h"
#include "zaya/ops/gemm.h"
#include "zaya/optim/optimizer.h"
#include "zaya/train/master_weights.h"

namespace zaya::app {
namespace {

struct BenchStepFlags {
  ModelSource source;
  int64_t steps = 0, batch = 8, seq = 256;
  bool gemm_shapes = false, sections = false, paced = false, recompute = false, optimizer = false;
  std::string param_dtype = "f32";
  std::string activation_dtype = "f32";
};

// --optimizer: the update a training step ends with, as TrainStep runs it on one rank (the
// optimizer's step, on the fp32 master weights with bf16 weights, which are then rounded from
// them; then the balancer on the step's expert loads),
// at the config's optim.lr (no schedule: the rate does not change the work).
struct StepUpdate {
  optim::Optimizer* optimizer = nullptr;
  train::MasterWeights* master = nullptr;  // --param-dtype bf16
  double lr = 0;

  void run(const model::ZayaModel& m) const {
    std::vector<int64_t> counts;
    m.add_expert_counts(counts);
    optimizer->step(lr);  // also zeroes the gradients, so the step needs no zero_grad
    if (master) master->after_update();
    optimizer->balance_step(counts, lr);
  }
};

constexpr double kMiB = 1024.0 * 1024.0;

// This process's peak resident memory (getrusage's maximum resident set, KiB on Linux): parameters,
// gradients and the activation pages the steps touched.
double peak_rss_mib() {
  struct rusage u {};
  return ::getrusage(RUSAGE_SELF, &u) == 0 ? static_cast<double>(u.ru_maxrss) / 1024.0 : 0.0;
}

// Times `steps` training steps (zero_grad, forward with the loss gradient, backward; with
// `update`, the optimizer's update instead of zero_grad) on [B, T] random tokens after one untimed
// warm-up step; prints one line per phase and the throughput. On a GPU every phase ends with a
// device synchronization, so each phase's time is the device's, not the time its kernels took to
// launch.
// Paced (--paced): after the warm-up step the command prints "bench: ready" and then runs one
// timed step per line read from standard input, printing "bench: step K forward F ms backward B ms
// gemm G ms X GFLOP" after each; end of input ends the run early. benchmarks/model_vs_hf.py drives it to
// alternate single steps of zaya and transformers, so each pair is timed within a second on a
// machine whose speed drifts.
void run_bench(model::ZayaModel& m, int64_t steps, bool gemm_shapes, bool sections, bool paced,
               const StepUpdate* update) {
  using clock = std::chrono::steady_clock;
  const int64_t B = m.batch(), T = m.seq_len(), V = m.config().vocab_size;
  std::vector<int32_t> ids(static_cast<size_t>(B * T)), tg(static_cast<size_t>(B * T));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = 1 + static_cast<int32_t>(philox_uniform(12345, i) * static_cast<float>(V - 1)) %
                     static_cast<int32_t>(V - 1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) tg[b * T + t] = t + 1 < T ? ids[b * T + t + 1] : -100;
  const bool gpu = m.device() != Device::cpu;
  const auto device_done = [gpu] {
    if (gpu) cuda::synchronize();  // kernels run asynchronously: a phase ends when the device is done
  };
  Tensor tid = Tensor::borrow(ids.data(), Shape{B, T}, DType::i32).to(m.device());
  Tensor ttg = Tensor::borrow(tg.data(), Shape{B, T}, DType::i32).to(m.device());
  double fwd = 0, bwd = 0, opt = 0, loss = 0;
  ops::cpu::gemm_profile_shapes(gemm_shapes);
  m.time_sections(sections);
  if (update) m.zero_grad();  // from then on the optimizer's step leaves the gradients zeroed
  for (int64_t s = -1; s < steps; ++s) {
    if (s == 0) {  // the warm-up step builds the GEMM primitives
      ops::cpu::gemm_time_reset();
      m.reset_section_times();
      if (paced) {
        std::printf("bench: ready\n");
        std::fflush(stdout);
      }
    }
    std::string go;
    if (paced && s >= 0 && !std::getline(std::cin, go)) {
      steps = s;  // the driver closed the pipe: the summary covers the steps run
      break;
    }
    const ops::cpu::GemmTimeStats gemm_before = ops::cpu::gemm_time_stats();
    if (!update) m.zero_grad();
    device_done();
    auto t0 = clock::now();
    loss = m.forward(tid, ttg, true);
    device_done();
    auto t1 = clock::now();
    m.backward();
    device_done();
    auto t2 = clock::now();
    if (update) update->run(m);
    device_done();
    auto t3 = clock::now();
    if (s >= 0) {
      const double f = std::chrono::duration<double>(t1 - t0).count(),
                   b = std::chrono::duration<double>(t2 - t1).count(),
                   u = std::chrono::duration<double>(t3 - t2).count();
      fwd += f;
      bwd += b;
      if (update) opt += u;
      if (paced) {
        const ops::cpu::GemmTimeStats g = ops::cpu::gemm_time_stats();
        std::printf("bench: step %lld forward %.3f ms backward %.3f ms gemm %.3f ms %.3f GFLOP",
                    static_cast<long long>(s + 1), 1e3 * f, 1e3 * b, 1e3 * (g.seconds - gemm_before.seconds),
                    1e-9 * (g.flops - gemm_before.flops));
        if (update) std::printf(" optimizer %.3f ms", 1e3 * u);
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  }
  ZAYA_CHECK(steps > 0, "bench step --paced: input ended before the first timed step");
  const double n = static_cast<double>(steps), step = (fwd + bwd + opt) / n;
  std::printf("bench: batch %lld x %lld tokens, %lld steps, gemm %s, loss %.4f, recompute %s, saved activations %s\n",
              static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(steps),
              m.gemm_dtype() == DType::bf16 ? "bf16" : "f32", loss, m.recompute() ? "on" : "off",
              m.activation_dtype() == DType::bf16 ? "bf16" : "f32");
  std::printf("bench: forward %.2f ms, backward %.2f ms, step %.2f ms\n", 1e3 * fwd / n, 1e3 * bwd / n,
              1e3 * step);
  if (update)
    std::printf("bench: optimizer %.2f ms per step (in the step: %s%s, the balancer)\n", 1e3 * opt / n,
                update->optimizer->config().muon ? "Muon + AdamW" : "AdamW",
                update->master ? " on the fp32 master weights, then rounded to bf16" : "");
  const double tokens_per_s = static_cast<double>(B * T) / step;
  std::printf("bench: tokens/s %.1f\n", tokens_per_s);
  // Model FLOPs as `zaya size` and the trainer's MFU count them (6·(active + embedding) + attention).
  const double flops_per_token = model::training_flops_per_token(m.config(), T);
  std::printf("bench: model %.6g GFLOP per token, %.3f TFLOP/s", 1e-9 * flops_per_token,
              1e-12 * flops_per_token * tokens_per_s);
  if (gpu && !cuda::emulated()) {
    const std::vector<cuda::DeviceInfo> dev = cuda::devices();
    if (const auto peak = dev.empty() ? std::nullopt : gpu_peak_by_device_name(dev[0].name))
      std::printf(", MFU %.1f%% of %s's %.0f TFLOP/s (%s)", 100.0 * flops_per_token * tokens_per_s / peak->flops_per_s,
                  peak->name.c_str(), 1e-12 * peak->flops_per_s, peak->basis.c_str());
  }
  std::printf("\n");
  if (sections) {
    // On a GPU the parts are host clock intervals, which equal the device's time only when every
    // kernel completes before its launch returns (CUDA_LAUNCH_BLOCKING=1, checked at start); the
    // GEMM clock is the CPU's alone, so there the GEMM columns are not known.
    m.time_sections(false);
    double total = 0;
    for (const auto& r : m.section_times()) total += r.seconds;
    total += opt;
    std::printf("bench: parts of the step (per step, GEMMs included; %.2f ms in all)\n", 1e3 * total / n);
    std::printf("bench:   %-62s %8s    %5s %8s %8s\n", "part", "time", "share", "GEMMs", "rest");
    const auto row = [&](const std::string& name, double seconds, double gemm_seconds) {
      std::printf("bench:   %-62s %8.2f ms %5.1f%% ", name.c_str(), 1e3 * seconds / n,
                  total > 0 ? 100.0 * seconds / total : 0.0);
      if (gpu)
        std::printf("%8s %8s\n", "-", "-");
      else
        std::printf("%8.2f %8.2f\n", 1e3 * gemm_seconds / n, 1e3 * (seconds - gemm_seconds) / n);
    };
    for (const auto& r : m.section_times()) row(r.name, r.seconds, r.gemm_seconds);
    if (update) row("optimizer: update and balancer", opt, 0.0);
  }
  if (gpu) {
    // zaya's own tensors on the device since the process started: weights, gradients, optimizer
    // state and master weights, activations (cuBLASLt's and cuDNN's workspaces are not tensors).
    std::printf("bench: device memory: peak %.1f MiB of tensors, %.1f MiB held after the steps, activation arena %.1f MiB\n",
                static_cast<double>(storage_bytes_peak(Device::cuda)) / kMiB,
                static_cast<double>(storage_bytes_in_use(Device::cuda)) / kMiB,
                static_cast<double>(m.activation_bytes()) / kMiB);
    return;  // the GEMM clock and the arena formula below are the CPU's
  }
  // The GEMM floor: what the step would take if everything but the library GEMMs took no time.
  const ops::cpu::GemmTimeStats g = ops::cpu::gemm_time_stats();
  std::printf(
      "bench: GEMMs %.2f ms per step (%lld calls, %.2f GFLOP at %.1f GFLOP/s), everything else %.2f ms\n",
      1e3 * g.seconds / n, static_cast<long long>(g.calls / steps), 1e-9 * g.flops / n,
      g.seconds > 0 ? 1e-9 * g.flops / g.seconds : 0.0, 1e3 * (step - g.seconds / n));
  if (g.side_by_side_calls > 0)
    std::printf(
        "bench: grouped GEMM calls run side by side: %.1f per step, threads finishing %.3f ms apart per "
        "call\n",
        static_cast<double>(g.side_by_side_calls) / n,
        1e3 * g.side_by_side_gap_seconds / static_cast<double>(g.side_by_side_calls));
  if (gemm_shapes) {
    ops::cpu::gemm_profile_shapes(false);
    std::printf("bench: GEMM shapes (per step; op letters, M x N x K, ? = tokens per expert)\n");
    for (const ops::cpu::GemmShapeTime& r : ops::cpu::gemm_shape_times())
      std::printf("bench:   %-34s %4.1f calls %8.2f ms %7.3f GFLOP %6.1f GFLOP/s\n", r.shape.c_str(),
                  static_cast<double>(r.calls) / n, 1e3 * r.seconds / n, 1e-9 * r.flops / n,
                  r.seconds > 0 ? 1e-9 * r.flops / r.seconds : 0.0);
  }
  // The formula (docs/model.md) counts the layer input too, which the model keeps outside the
  // layer's saved block.
  const double saved = m.saved_bytes_per_token_per_layer();
  const double layer_input = 4.0 * static_cast<double>(m.config().hidden_size);
  std::printf(
      "bench: activation arena %.1f MiB (saved per token per layer %.0f B + layer input %.0f B = %.0f B; "
      "formula %lld B)\n",
      static_cast<double>(m.activation_bytes()) / kMiB, saved, layer_input, saved + layer_input,
      static_cast<long long>(model::activation_bytes_per_token_per_layer(m.config(), 4)));
  if (m.recompute())
    std::printf("bench: recompute: each layer keeps %.0f B per token besides its input; one shared set of %.0f B\n",
                m.kept_bytes_per_token_per_layer(), saved);
  std::printf("bench: memory: activation arena %.1f MiB, peak RSS %.1f MiB\n",
              static_cast<double>(m.activation_bytes()) / kMiB, peak_rss_mib());
}

// --sections on a real GPU times host clock intervals: without CUDA_LAUNCH_BLOCKING=1 they
// measure kernel launches, not kernels, and the table would be wrong without saying so.
void check_sections_can_time(bool sections, const model::ZayaModel& m) {
  if (!sections || m.device() == Device::cpu || cuda::emulated()) return;
  const char* blocking = std::getenv("CUDA_LAUNCH_BLOCKING");
  ZAYA_CHECK(blocking != nullptr && std::string(blocking) == "1",
             "bench step --sections --device cuda: the parts are timed by the host's clock, which sees a kernel's "
             "end only when launches wait for their kernels; run with CUDA_LAUNCH_BLOCKING=1 (found ",
             blocking ? str("'", blocking, "'") : std::string("unset"), ")");
}

}  // namespace

void add_bench_step(CLI::App& bench, Commands& commands) {
  auto f = std::make_shared<BenchStepFlags>();
  auto* cmd = bench.add_subcommand(
      "step",
      "Time training steps (forward + backward) of a ZAYA1 model on random tokens: tokens/s, GEMMs, memory");
  cmd->add_option(
      "--model,--ckpt", f->source.model,
      "zaya checkpoint (step dir, or run dir using `latest`) or transformers save_pretrained directory");
  cmd->add_option("--init-config", f->source.init_config,
                  "instead of --model: a TOML run config ([model]) to init from");
  cmd->add_option("--seed", f->source.seed, "init seed with --init-config")->capture_default_str();
  cmd->add_option("--set", f->source.overrides,
                  "override a key of --init-config ([model], and [optim] with --optimizer): "
                  "model.num_hidden_layers=8 (repeatable)");
  cmd->add_option("--gemm-dtype", f->source.gemm_dtype,
                  "f32 or bf16 inputs for the weight GEMMs (experts, projections, LM head)")
      ->transform(dtype_vocabulary())
      ->capture_default_str();
  cmd->add_option("--param-dtype", f->param_dtype,
                  "f32 or bf16 weights (train.param_dtype): stored in bf16, with fp32 master weights that "
                  "--optimizer updates; needs --gemm-dtype bf16")
      ->transform(dtype_vocabulary())
      ->capture_default_str();
  cmd->add_option("--activation-dtype", f->activation_dtype,
                  "f32 or bf16 saved activations (train.activation_dtype); bf16 needs --gemm-dtype bf16")
      ->transform(dtype_vocabulary())
      ->capture_default_str();
  cmd->add_flag("--optimizer", f->optimizer,
                "end each step with the optimizer's update as training does (clip, Muon/AdamW of --init-config's "
                "[optim] at optim.lr, the balancer) and time it");
  cmd->add_option("--device", f->source.device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--steps", f->steps, "timed steps after one untimed warm-up step (with --paced: the most)")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--batch", f->batch, "batch rows")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--seq", f->seq, "sequence length")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_flag("--paced", f->paced,
                "after the warm-up, run one timed step per line read from stdin and print each step's times "
                "(benchmarks/model_vs_hf.py alternates zaya's and transformers' steps with it)");
  cmd->add_flag("--recompute", f->recompute,
                "recompute each layer's activations in the backward from its input (ZayaModel::set_recompute): "
                "about one layer's saved activations instead of all, for L - 1 more layer forwards");
  cmd->add_flag("--gemm-shapes", f->gemm_shapes, "also time every GEMM shape of the step");
  cmd->add_flag("--sections", f->sections,
                "also time each part of the step (each block's forward and backward, head, loss)");
  commands.push_back({cmd, [f] {
                        ZAYA_CHECK(f->param_dtype == "f32" || f->param_dtype == "bf16",
                                   "--param-dtype: expected f32 or bf16, found '", f->param_dtype, "'");
                        optim::OptimizerConfig oc;
                        auto m = make_model(f->source, f->batch, f->seq, "bench step", f->optimizer ? &oc : nullptr);
                        apply_gemm_dtype(f->source, *m);
                        ZAYA_CHECK(f->activation_dtype == "f32" || f->activation_dtype == "bf16",
                                   "--activation-dtype: expected f32 or bf16, found '", f->activation_dtype, "'");
                        if (f->activation_dtype == "bf16") m->set_activation_dtype(DType::bf16);
                        m->set_recompute(f->recompute);
                        check_sections_can_time(f->sections, *m);
                        std::unique_ptr<optim::Optimizer> optimizer;
                        std::unique_ptr<train::MasterWeights> master;
                        ZAYA_CHECK(f->param_dtype == "f32" || m->gemm_dtype() == DType::bf16,
                                   "--param-dtype bf16 needs --gemm-dtype bf16: the GEMMs read the bf16 weights as "
                                   "they are stored");
                        if (f->param_dtype == "bf16" && f->optimizer) {
                          // As the trainer: the optimizer updates fp32 masters taken from the f32
                          // weights, which are then stored in bf16.
                          master = std::make_unique<train::MasterWeights>(*m, optim::ShardRange{});
                          optimizer = std::make_unique<optim::Optimizer>(oc, master->table());
                          master->adopt();
                        } else {
                          if (f->optimizer) optimizer = std::make_unique<optim::Optimizer>(oc, optim::ParamTable::of(*m));
                          if (f->param_dtype == "bf16") m->store_weights_bf16();
                        }
                        StepUpdate update{optimizer.get(), master.get(), oc.lr};
                        std::printf("bench: weights %s, optimizer %s\n",
                                    master ? "bf16 (fp32 master weights)" : "f32",
                                    optimizer ? (oc.muon ? "Muon + AdamW" : "AdamW") : "none (forward + backward only)");
                        run_bench(*m, f->steps, f->gemm_shapes, f->sections, f->paced, optimizer ? &update : nullptr);
                        return 0;
                      }});
}

}  // namespace zaya::app
