#include "zaya/ckpt/json_strict.h"

#include <set>
#include <vector>

#include "zaya/core/error.h"

namespace zaya::ckpt {

nlohmann::json parse_json_strict(std::string_view text, const std::string& what, int max_depth) {
  // One key set per open object; arrays push nothing (they have no keys) but count toward depth.
  std::vector<std::set<std::string>> open_objects;
  std::vector<bool> is_object;  // the kind of each open container, to pop the right stack
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        if (depth >= max_depth)
          throw Error("JSON nested too deeply", {.file = what, .expected = str("depth <= ", max_depth)});
        is_object.push_back(event == E::object_start);
        if (event == E::object_start) open_objects.emplace_back();
        break;
      case E::object_end:
      case E::array_end:
        if (!is_object.empty()) {
          if (is_object.back()) open_objects.pop_back();
          is_object.pop_back();
        }
        break;
      case E::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!open_objects.empty() && !open_objects.back().insert(key).second)
          throw Error("duplicate key in JSON object", {.file = what, .field = key,
                                                       .expected = "each key once", .found = "it twice"});
        break;
      }
      case E::value:
        break;
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str("malformed JSON: ", e.what()), {.file = what});
  }
}

std::string json_brief(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

}  // namespace zaya::ckpt
