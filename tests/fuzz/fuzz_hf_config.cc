// libFuzzer target: transformers' config.json reader (model::ModelConfig::from_hf_json_text) on
// arbitrary text. Any input must end in a validated ModelConfig or a zaya::Error; a crash, hang,
// sanitizer report or other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "zaya/core/error.h"
#include "zaya/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto c = zaya::model::ModelConfig::from_hf_json_text({reinterpret_cast<const char*>(data), size},
                                                               "fuzz/config.json");
    // An accepted config must write a config.json that reads back to the same config.
    const std::string json = c.to_hf_json();
    const auto again = zaya::model::ModelConfig::from_hf_json_text(json, "fuzz/again.json");
    if (again.to_hf_json() != json) __builtin_trap();
  } catch (const zaya::Error&) {
  }
  return 0;
}
