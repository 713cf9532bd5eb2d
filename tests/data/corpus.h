// A small deterministic English-like corpus for tokenizer and prepare tests (a few KB: keeps
// SentencePiece training well under a second).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zaya::data::testing {

inline std::vector<std::string> make_paragraphs(int count, uint64_t seed) {
  static const char* kWords[] = {"the",       "model",     "tokens",   "data",    "loader",   "shuffle",
                                 "training",  "python",    "function", "returns", "value",    "list",
                                 "string",    "error",     "file",     "module",  "class",    "object",
                                 "method",    "argument",  "default",  "example", "number",   "of",
                                 "a",         "is",        "in",       "to",      "and",      "for",
                                 "with",      "when",      "print(x)", "x = 42",  "def f():", "return None",
                                 "import os", "self.name", "0.5",      "2024",    "naïve",    "über"};
  constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);
  uint64_t s = seed * 2654435761u + 1;
  auto next = [&s] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>((s >> 33) % 1000003);
  };
  std::vector<std::string> paras;
  for (int p = 0; p < count; ++p) {
    std::string text;
    const int lines = 1 + next() % 3;
    for (int l = 0; l < lines; ++l) {
      const int words = 4 + next() % 9;
      if (next() % 4 == 0) text += "    ";  // indentation, as in code blocks
      for (int w = 0; w < words; ++w) {
        if (w) text += ' ';
        text += kWords[next() % kNumWords];
      }
      text += next() % 2 ? ".\n" : "\n";
    }
    paras.push_back(text);
  }
  return paras;
}

}  // namespace zaya::data::testing
