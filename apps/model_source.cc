#include "model_source.h"

#include "zaya/core/config.h"
#include "zaya/core/error.h"
#include "zaya/train/model_io.h"

namespace zaya::app {

std::unique_ptr<model::ZayaModel> make_model(const ModelSource& s, int64_t batch, int64_t seq,
                                             const std::string& command) {
  ZAYA_CHECK(s.model.empty() != s.init_config.empty(), command,
             ": give exactly one of --model and --init-config");
  if (!s.model.empty()) return train::load_model_source(s.model, batch, seq).model;
  ConfigReader reader = ConfigReader::from_file(s.init_config);
  auto m = std::make_unique<model::ZayaModel>(model::ModelConfig::from_toml(reader), batch, seq);
  m->init(s.seed);
  return m;
}

void apply_gemm_dtype(const ModelSource& s, model::ZayaModel& m) {
  ZAYA_CHECK(s.gemm_dtype == "f32" || s.gemm_dtype == "bf16", "--gemm-dtype: expected f32 or bf16, found '",
             s.gemm_dtype, "'");
  if (s.gemm_dtype == "bf16") m.set_gemm_dtype(DType::bf16);
}

}  // namespace zaya::app
