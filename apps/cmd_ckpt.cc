// zaya ckpt: inspect | verify | export-hf | import-hf (+ hidden write-test-file / write-test-checkpoint
// for the interop tests).
// Exit codes: 0 ok, 1 verify found a problem (corrupt or incomplete checkpoint), 2 usage error or
// unreadable input.
#include <cstdio>
#include <iostream>
#include <string>

#include "cli_vocabulary.h"
#include "commands.h"
#include "model_source.h"
#include "zaya/ckpt/hf_io.h"
#include "zaya/train/model_io.h"
#include "zaya/ckpt/reader.h"
#include "zaya/ckpt/safetensors.h"
#include "zaya/ckpt/writer.h"
#include "zaya/core/error.h"
#include "zaya/data/hf_tokenizer.h"
#include "zaya/train/run_tokenizer.h"

namespace zaya::app {
namespace {

namespace ck = zaya::ckpt;
namespace fs = std::filesystem;

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Sum of the elements (as double) for the dtypes zaya computes with; lets tests compare values
// without a second parser.
std::string element_sum(std::span<const std::byte> raw, const std::string& dtype) {
  double sum = 0;
  auto each = [&](auto tag, auto to_double) {
    using T = decltype(tag);
    for (size_t i = 0; i + sizeof(T) <= raw.size(); i += sizeof(T)) {
      T v;
      std::memcpy(&v, raw.data() + i, sizeof(T));
      sum += to_double(v);
    }
  };
  if (dtype == "F32") each(float{}, [](float v) { return double(v); });
  else if (dtype == "BF16") each(bf16{}, [](bf16 v) { return double(to_float(v)); });
  else if (dtype == "I32") each(int32_t{}, [](int32_t v) { return double(v); });
  else if (dtype == "I64") each(int64_t{}, [](int64_t v) { return double(v); });
  else if (dtype == "U8") each(uint8_t{}, [](uint8_t v) { return double(v); });
  else if (dtype == "F64") each(double{}, [](double v) { return v; });
  else return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", sum);
  return buf;
}

int inspect_file(const fs::path& path) {
  ck::SafetensorsFile f(path);
  const auto& h = f.header();
  std::printf("safetensors  %s\nbytes        %llu (header %llu, data %llu)\ntensors      %zu\n", path.c_str(),
              static_cast<unsigned long long>(h.data_start + h.data_bytes), static_cast<unsigned long long>(h.header_bytes),
              static_cast<unsigned long long>(h.data_bytes), h.tensors.size());
  for (const auto& [k, v] : h.metadata) std::printf("metadata     %s = %s\n", k.c_str(), v.c_str());
  std::printf("%-48s %-6s %-20s %12s %s\n", "name", "dtype", "shape", "bytes", "sum");
  for (const auto& t : h.tensors)
    std::printf("%-48s %-6s %-20s %12llu %s\n", t.name.c_str(), t.dtype.c_str(), shape_str(t.shape).c_str(),
                static_cast<unsigned long long>(t.nbytes()), element_sum(f.raw(t.name), t.dtype).c_str());
  return 0;
}

int inspect(const std::string& target) {
  std::error_code ec;
  if (fs::is_regular_file(target, ec)) return inspect_file(target);
  ck::Checkpoint c(target);
  const ck::Manifest& m = c.manifest();
  uint64_t file_bytes = 0, tensor_bytes = 0;
  for (const auto& f : m.files) file_bytes += f.bytes;
  for (const auto& [name, t] : m.tensors)
    for (const auto& ch : t.chunks) tensor_bytes += ch.byte_end - ch.byte_begin;
  std::printf("checkpoint   %s\nstep         %lld\nworld size   %d\nfiles        %zu (%llu bytes)\ntensors      %zu (%llu bytes)\n",
              c.dir().c_str(), static_cast<long long>(m.step), m.world_size, m.files.size(),
              static_cast<unsigned long long>(file_bytes), m.tensors.size(), static_cast<unsigned long long>(tensor_bytes));
  std::printf("%-48s %-6s %-20s %6s %12s\n", "name", "dtype", "shape", "chunks", "bytes");
  for (const auto& [name, t] : m.tensors) {
    uint64_t b = 0;
    for (const auto& ch : t.chunks) b += ch.byte_end - ch.byte_begin;
    std::printf("%-48s %-6s %-20s %6zu %12llu\n", name.c_str(), t.dtype.c_str(), shape_str(t.shape).c_str(), t.chunks.size(),
                static_cast<unsigned long long>(b));
  }
  std::printf("state\n%s\n", m.state.dump(2).c_str());
  return 0;
}

int verify(const std::string& target) {
  fs::path dir = ck::Checkpoint::resolve(target);  // not a checkpoint at all: exit 2
  std::unique_ptr<ck::Checkpoint> c;
  try {
    c = std::make_unique<ck::Checkpoint>(dir);
  } catch (const Error& e) {  // a checkpoint whose manifest is bad: a failed check
    std::printf("FAILED %s\n  %s\n", dir.c_str(), e.what());
    return 1;
  }
  ck::VerifyReport r = c->verify();
  if (!r.ok()) {
    std::printf("FAILED %s: %zu problem(s)\n", dir.c_str(), r.problems.size());
    for (const auto& p : r.problems) std::printf("  %s\n", p.c_str());
    return 1;
  }
  std::printf("OK %s: step %lld, %zu tensors, %zu chunks, %llu bytes checked\n", dir.c_str(),
              static_cast<long long>(c->manifest().step), c->manifest().tensors.size(), r.chunks_checked,
              static_cast<unsigned long long>(r.bytes_checked));
  return 0;
}

// A small file with one tensor of each zaya dtype and known values (tests/python checks them).
int write_test_file(const std::string& out) {
  Tensor f32 = Tensor::empty({2, 3}, DType::f32), b16 = Tensor::empty({4}, DType::bf16),
         i32 = Tensor::empty({3}, DType::i32), i64 = Tensor::empty({2, 2}, DType::i64), u8 = Tensor::empty({5}, DType::u8),
         scalar = Tensor::empty({}, DType::f32);
  for (int i = 0; i < 6; ++i) f32.data<float>()[i] = i * 0.5f - 1.0f;
  for (int i = 0; i < 4; ++i) b16.data<bf16>()[i] = to_bf16((i + 1) * 0.25f);
  const int32_t iv[3] = {-1, 0, 7};
  for (int i = 0; i < 3; ++i) i32.data<int32_t>()[i] = iv[i];
  for (int i = 0; i < 4; ++i) i64.data<int64_t>()[i] = (int64_t{1} << 40) + i;
  for (int i = 0; i < 5; ++i) u8.data<uint8_t>()[i] = static_cast<uint8_t>(i * 50);
  scalar.data<float>()[0] = 3.5f;
  ck::write_safetensors(out, {ck::st_entry("f32", f32), ck::st_entry("bf16", b16), ck::st_entry("i32", i32),
                              ck::st_entry("i64", i64), ck::st_entry("u8", u8), ck::st_entry("scalar", scalar)},
                        {{"format", "pt"}});
  return 0;
}

// A 3-rank checkpoint (step 7) of a [6, 4] F32 tensor with values 0..23 split by rows 2/2/2,
// plus a BF16 vector held whole by rank 0, for the CLI/interop tests.
int write_test_checkpoint(const std::string& run_dir) {
  std::vector<std::vector<ck::SaveItem>> ranks(3);
  for (int r = 0; r < 3; ++r) {
    Tensor rows = Tensor::empty({2, 4}, DType::f32);
    for (int i = 0; i < 8; ++i) rows.data<float>()[i] = static_cast<float>(r * 8 + i);
    ranks[r].push_back({"w", rows, {6, 4}, {2 * r, 0}});
  }
  Tensor v = Tensor::empty({3}, DType::bf16);
  for (int i = 0; i < 3; ++i) v.data<bf16>()[i] = to_bf16(i + 0.5f);
  ranks[0].push_back({"v", v, {}, {}});
  ck::save_checkpoint(run_dir, 7, ranks, {{"step", 7}, {"config", {{"hidden_size", 4}}}});
  return 0;
}

struct ExportArgs {
  uint64_t shard_bytes = 5'000'000'000ull;  // transformers' save_pretrained default, "5GB"
  std::string tokenizer;
  bool no_tokenizer = false;
};

int export_hf(const std::string& source, const std::string& out, const std::string& dtype, const ExportArgs& a) {
  ZAYA_CHECK(!(a.no_tokenizer && !a.tokenizer.empty()), "ckpt export-hf: give --tokenizer or --no-tokenizer, not both");
  // Found before anything is written: a tokenizer that cannot be found fails the export up front.
  const std::string tokenizer = a.no_tokenizer ? "" : a.tokenizer.empty() ? source_tokenizer(source) : a.tokenizer;
  // A new or empty directory: shards or a tokenizer of an earlier export left beside this one would
  // make a folder transformers reads as a mix of both.
  ckpt::require_new_directory(out, "ckpt export-hf --out");
  train::LoadedModel m = train::load_model_source(source, 1, 1);
  ckpt::export_hf(*m.model, out, dtype == "bf16" ? DType::bf16 : DType::f32, a.shard_bytes);
  std::cout << "exported " << m.source.string() << " -> " << out << " (" << dtype << ")\n";
  if (!tokenizer.empty()) {
    const model::ModelConfig& c = m.model->config();
    data::write_hf_tokenizer(tokenizer, {c.bos_token_id, c.eos_token_id, c.pad_token_id}, out);
    std::cout << "tokenizer " << tokenizer << " -> " << (fs::path(out) / "tokenizer.model").string() << "\n";
  } else if (!a.no_tokenizer) {
    std::cout << "tokenizer none: the checkpoint records none (give --tokenizer MODEL to include one)\n";
  }
  return 0;
}

void add_ckpt(CLI::App& app, Commands& commands) {
  auto* cmd = app.add_subcommand("ckpt", "Inspect, verify, export and import checkpoints");
  cmd->require_subcommand(1);
  auto target = std::make_shared<std::string>();
  auto* insp = cmd->add_subcommand("inspect", "Tensors, dtypes, shapes, bytes, step and state of a checkpoint (or one .safetensors file)");
  insp->add_option("DIR", *target, "Step directory, run directory (uses `latest`) or .safetensors file")->required();
  auto* ver = cmd->add_subcommand("verify", "Check every checksum and the manifest's completeness (exit 0 ok, 1 failed)");
  ver->add_option("DIR", *target, "Step directory or run directory (uses `latest`)")->required();
  auto* wtf = cmd->add_subcommand("write-test-file", "Write a small safetensors file with known values (interop tests)");
  wtf->add_option("OUT", *target, "Output path")->required();
  wtf->group("");  // hidden from --help
  auto* wtc = cmd->add_subcommand("write-test-checkpoint", "Write a small 3-rank checkpoint (interop tests)");
  wtc->add_option("RUN_DIR", *target, "Run directory")->required();
  wtc->group("");
  auto out = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("f32");
  auto exp_args = std::make_shared<ExportArgs>();
  auto* exp = cmd->add_subcommand(
      "export-hf",
      "Export a checkpoint's model as a Hugging Face directory: config.json, generation_config.json, "
      "safetensors (sharded above --shard-size) and the tokenizer");
  exp->add_option("DIR", *target, "Step directory or run directory (uses `latest`)")->required();
  exp->add_option("--out", *out, "Output directory (transformers' from_pretrained loads it)")->required();
  exp->add_option("--dtype", *dtype, "Weight dtype: f32 or bf16")->transform(dtype_vocabulary())->capture_default_str();
  exp->add_option("--shard-size", exp_args->shard_bytes,
                  "Split the weights into model-0000i-of-0000n.safetensors + model.safetensors.index.json above "
                  "this size (bytes, or with a unit: 5GB = 5e9, 500MiB = 500 x 2^20; default 5GB as transformers)")
      ->transform(CLI::AsSizeValue(true))
      ->check(CLI::PositiveNumber);
  exp->add_option("--tokenizer", exp_args->tokenizer,
                  "SentencePiece .model to export (default: the one the checkpoint records)");
  exp->add_flag("--no-tokenizer", exp_args->no_tokenizer, "Export the model only");
  auto* imp = cmd->add_subcommand("import-hf", "Import a Hugging Face directory as a zaya checkpoint (a training start point)");
  imp->add_option("HFDIR", *target, "transformers save_pretrained directory")->required();
  imp->add_option("--out", *out, "New (or empty) run directory to write step_0000000/ into")->required();
  commands.push_back({cmd, [=] {
                        if (insp->parsed()) return inspect(*target);
                        if (ver->parsed()) return verify(*target);
                        if (wtf->parsed()) return write_test_file(*target);
                        if (wtc->parsed()) return write_test_checkpoint(*target);
                        if (exp->parsed()) return export_hf(*target, *out, *dtype, *exp_args);
                        ckpt::require_new_directory(*out, "ckpt import-hf --out");
                        auto m = ckpt::load_hf_model(*target, 1, 1);
                        nlohmann::json state{{"imported_from", *target}};
                        // The folder's tokenizer, copied into the run directory (and named by its
                        // absolute path), so generate --prompt and a later export-hf find it from the
                        // imported checkpoint too, after the folder is gone.
                        if (const std::string tok = source_tokenizer(*target); !tok.empty()) {
                          state["tokenizer"] = fs::absolute(tok).lexically_normal().string();
                          state["tokenizer_copy"] = train::keep_run_tokenizer(*out, tok);
                        }
                        auto dir = train::save_weights_checkpoint(*m, *out, state);
                        std::cout << "imported " << *target << " -> " << dir.string()
                                  << " (start a run from it with train.init_from)\n";
                        return 0;
                      }});
}

}  // namespace
}  // namespace zaya::app

ZAYA_COMMAND(ckpt, zaya::app::add_ckpt);
