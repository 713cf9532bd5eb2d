// Hardware profiles: the peaks a model is sized against. Built-in ones come from datasheets
// (REFERENCES.md "Hardware peaks", docs/sizing.md lists the sources); measured ones are JSON files
// written by `zaya bench gemm` / `zaya bench membw`.
#pragma once

#include <string>
#include <vector>

namespace zaya::sizing {

struct HardwareProfile {
  std::string name;
  double peak_bf16_flops = 0;      // dense bf16 FLOP/s (the MFU denominator)
  double achievable_flops = 0;     // large-GEMM rate actually reached (measured or typical)
  double memory_bytes = 0;         // device memory
  double memory_bandwidth = 0;     // bytes/s
  double intra_node_bandwidth = 0; // bytes/s per GPU, one direction, to peers in the node
  double inter_node_bandwidth = 0; // bytes/s per GPU, one direction, over the NICs
  int gpus_per_node = 8;
  std::string source;
};

// "mi300x", "h100", "h200"; throws zaya::Error listing the names for anything else.
HardwareProfile builtin_profile(const std::string& name);
std::vector<std::string> builtin_profile_names();
// A profile JSON (fields as in HardwareProfile); throws naming the file and the field.
HardwareProfile load_profile(const std::string& path);
// A name of a built-in profile, or a path to a JSON file.
HardwareProfile resolve_profile(const std::string& name_or_path);

}  // namespace zaya::sizing
