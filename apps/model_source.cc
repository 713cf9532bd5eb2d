#include "model_source.h"

#include "zaya/core/config.h"
#include "zaya/core/error.h"
#include "zaya/train/model_io.h"

namespace zaya::app {

std::unique_ptr<model::ZayaModel> make_model(const ModelSource& s, int64_t batch, int64_t seq,
                                             const std::string& command) {
  ZAYA_CHECK(s.model.empty() != s.init_config.empty(), command,
             ": give exactly one of --model and --init-config");
  if (!s.model.empty()) return load_model_checked(s.model, batch, seq, command).model;
  ConfigReader reader = ConfigReader::from_file(s.init_config);
  const model::ModelConfig config = model::ModelConfig::from_toml(reader);
  check_positions(config, seq, command);
  auto m = std::make_unique<model::ZayaModel>(config, batch, seq);
  m->init(s.seed);
  return m;
}

train::LoadedModel load_model_checked(const std::string& path, int64_t batch, int64_t seq, const std::string& what) {
  train::LoadedModel m = train::load_model_source(path, 1, 1);  // the weights, and the smallest activations
  check_positions(m.model->config(), seq, what);
  m.model->set_batch_shape(batch, seq);
  return m;
}

void check_positions(const model::ModelConfig& c, int64_t positions, const std::string& what) {
  ZAYA_CHECK(positions <= c.max_position_embeddings, what, ": ", positions,
             " positions exceed the model's max_position_embeddings (", c.max_position_embeddings,
             "), the longest sequence it is made for");
}

void apply_gemm_dtype(const ModelSource& s, model::ZayaModel& m) {
  ZAYA_CHECK(s.gemm_dtype == "f32" || s.gemm_dtype == "bf16", "--gemm-dtype: expected f32 or bf16, found '",
             s.gemm_dtype, "'");
  if (s.gemm_dtype == "bf16") m.set_gemm_dtype(DType::bf16);
}

}  // namespace zaya::app
