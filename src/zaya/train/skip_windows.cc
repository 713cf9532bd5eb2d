#include "zaya/train/skip_windows.h"

#include <algorithm>

#include "zaya/core/error.h"

namespace zaya::train {

SampleWindow parse_sample_window(const std::string& text, const std::string& what) {
  const size_t colon = text.find(':');
  auto number = [&](const std::string& s, int64_t& out) {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 18) return false;
    out = std::stoll(s);
    return true;
  };
  int64_t a = 0, b = 0;
  if (colon == std::string::npos || !number(text.substr(0, colon), a) || !number(text.substr(colon + 1), b) ||
      a >= b)
    throw Error(str(what, " \"", text,
                    "\": expected A:B, global sample indices with 0 <= A < B (the window [A, B))"));
  return {a, b};
}

std::vector<SampleWindow> merge_windows(std::vector<SampleWindow> a, const std::vector<SampleWindow>& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end());
  std::vector<SampleWindow> out;
  for (const SampleWindow& w : a) {
    if (!out.empty() && w.first <= out.back().second)
      out.back().second = std::max(out.back().second, w.second);
    else
      out.push_back(w);
  }
  return out;
}

int64_t skip_past_windows(int64_t next, int64_t batch, const std::vector<SampleWindow>& windows) {
  for (bool moved = true; moved;) {
    moved = false;
    for (const SampleWindow& w : windows)
      if (next < w.second && w.first < next + batch) {
        next = w.second;
        moved = true;
      }
  }
  return next;
}

nlohmann::json windows_json(const std::vector<SampleWindow>& w) {
  nlohmann::json j = nlohmann::json::array();
  for (const SampleWindow& x : w) j.push_back({x.first, x.second});
  return j;
}

std::vector<SampleWindow> windows_from_json(const nlohmann::json& state, const std::string& where) {
  std::vector<SampleWindow> out;
  if (!state.contains("skip_samples")) return out;
  const nlohmann::json& j = state["skip_samples"];
  ZAYA_CHECK(j.is_array(), where, ": state.skip_samples is not a list of [A, B] windows");
  for (const nlohmann::json& w : j) {
    ZAYA_CHECK(w.is_array() && w.size() == 2 && w[0].is_number_integer() && w[1].is_number_integer() &&
                   w[0].get<int64_t>() >= 0 && w[0].get<int64_t>() < w[1].get<int64_t>(),
               where, ": state.skip_samples holds ", w.dump(), ", not a window [A, B] with 0 <= A < B");
    out.emplace_back(w[0].get<int64_t>(), w[1].get<int64_t>());
  }
  return merge_windows(out, {});
}

}  // namespace zaya::train
