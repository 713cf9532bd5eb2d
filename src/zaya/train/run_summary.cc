// The trainer's start-up summary (model, world, plans, memory by part, optimizer, batch or recipe)
// and the memory measured after the first step: what a user reads before the first loss.
#include <cstdio>
#include <string>

#include "zaya/core/log.h"
#include "zaya/core/threads.h"
#include "zaya/model/params.h"
#include "zaya/train/trainer.h"

namespace zaya::train {
namespace {

std::string human_bytes(double b) {
  char s[32];
  if (b >= 1024.0 * 1024 * 1024)
    std::snprintf(s, sizeof s, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else
    std::snprintf(s, sizeof s, "%.1f MiB", b / (1024.0 * 1024));
  return s;
}

}  // namespace

void Trainer::print_summary() const {
  const auto& c = cfg_.model;
  model::ParamCounts n = model::count_parameters(c);
  const double P = static_cast<double>(n.total);
  log_info("model: H ", c.hidden_size, ", L ", c.num_hidden_layers, ", heads ", c.num_attention_heads, "/",
           c.num_key_value_heads, "x", c.head_dim, ", experts ", c.num_experts, "x", c.moe_intermediate_size,
           ", router ", c.router_hidden_size, ", vocab ", c.vocab_size);
  char line[256];
  std::snprintf(line, sizeof line,
                "parameters: total %.2fM, active %.2fM, embedding %.2fM, non-embedding %.2fM", P / 1e6,
                n.active / 1e6, n.embedding / 1e6, n.non_embedding / 1e6);
  log_info(line);
  log_info("world: ", comm_->size(), " rank", comm_->size() == 1 ? "" : "s", " (", dist::backend_name(comm_->backend()),
           device_comm_ ? str("; the gradients", cp_group_ ? " and the cp exchanges" : "", " over ",
                              dist::backend_name(device_comm_->backend()))
                        : std::string(),
           "), mesh dp ", mesh_->dp_size(), " x cp ", mesh_->cp_size(), "; ",
           rank_threads_summary(comm_->rank(), comm_->size(), num_threads()));
  if (sync_) {
    log_info(plan_.str());
    log_info(sync_->plan_str());
  }
  if (sync_)
    log_info("parameter all-gather: ", master_ ? "bf16 (the weights as stored)" : "f32", ", ",
             cfg_.parallel.overlap_param_gather ? "prefetched under the next forward, bucket by bucket"
                                                : "waited for after each update");
  log_info("memory per rank", model_->device() == Device::cpu ? "" : " (on the GPU)", ": weights ",
           human_bytes(static_cast<double>(model_->params_flat().nbytes())),
           master_ ? str(" (bf16) + fp32 master weights ",
                         human_bytes(static_cast<double>(master_->bytes())),
                         comm_->size() > 1 ? " (this rank's shard)" : "")
                   : std::string(" (f32)"),
           ", gradients ", human_bytes(4 * P),
           sync_ && sync_->buffer_bytes() > 0
               ? str(" + ", human_bytes(static_cast<double>(sync_->buffer_bytes())), " ",
                     grad_reduce_name(sync_->mode()), " reduction buffer")
               : std::string(),
           ", optimizer state ", human_bytes(static_cast<double>(optimizer_->state_bytes())),
           comm_->size() > 1 ? str(" (this rank's 1/", comm_->size(), " shard)") : std::string(),
           ", activations ", human_bytes(static_cast<double>(model_->activation_bytes())), " (",
           cfg_.train.micro_batch, "x", cfg_.train.seq_len, " tokens per micro-batch",
           mesh_->cp_size() > 1 ? str(", this rank's 1/", mesh_->cp_size(), " of each sequence") : std::string(),
           cfg_.train.recompute ? ", recomputed in the backward from each layer's input" : "",
           cfg_.train.activation_dtype == "bf16" ? ", the large ones saved in bf16" : "",
           "); weight GEMMs (experts, projections, LM head) ",
           cfg_.train.gemm_dtype == "bf16" ? "bf16 inputs, f32 accumulation" : "f32");
  log_info("optimizer: ", optimizer_->summary().str());
  if (!cfg_.has_recipe()) {
    const int64_t tokens = cfg_.tokens_per_step() * mesh_->dp_size();
    log_info("batch: ", cfg_.train.micro_batch, " x ", cfg_.train.seq_len, " x ", cfg_.train.grad_accum,
             " accumulation", mesh_->dp_size() > 1 ? str(" x ", mesh_->dp_size(), " ranks") : std::string(), " = ",
             tokens, " tokens per step; ", cfg_.train.steps, " steps = ", tokens * cfg_.train.steps,
             " tokens; threads ", num_threads());
    return;
  }
  const optim::Recipe& r = cfg_.recipe;
  log_info("recipe: ", r.phases.size(), " phases, ", r.total_tokens(), " tokens in ",
           r.num_steps(cfg_.train.micro_batch), " steps (this run: ", cfg_.train.steps, "); micro-batch ",
           cfg_.train.micro_batch, "; threads ", num_threads());
  for (size_t p = 0; p < r.phases.size(); ++p) {
    const optim::Phase& ph = r.phases[p];
    log_info("  phase ", p, " '", ph.name, "': ", ph.tokens, " tokens, seq_len ", ph.seq_len, ", rope_theta ",
             ph.rope_theta, ", batch ", ph.batch_size, " (", ph.batch_size / cfg_.train.micro_batch,
             " x micro-batch ", cfg_.train.micro_batch, ")");
  }
  if (r.batch_ramp_start > 0 && r.batch_ramp_tokens > 0)
    log_info("  batch ramp: ", r.batch_ramp_start, " -> ", r.phases[0].batch_size,
             " sequences over the first ", r.batch_ramp_tokens, " tokens");
}

void Trainer::log_measured_memory() const {
  const Device dev = model_->device();
  log_info("memory measured after the first step: zaya's tensors on ", device_name(dev), " peaked at ",
           human_bytes(static_cast<double>(storage_bytes_peak(dev))), ", ",
           human_bytes(static_cast<double>(storage_bytes_in_use(dev))), " held between steps",
           dev == Device::cpu ? std::string() : str(" (", human_bytes(static_cast<double>(storage_bytes_peak(Device::cpu))),
                                                    " on the host)"));
}

}  // namespace zaya::train
