// A run keeps its own copy of its tokenizer, so its checkpoints stay usable (generate --prompt,
// eval on text, ckpt export-hf) from any directory and after the data directory that held the
// original is moved or deleted (docs/train.md, "The run directory").
#pragma once

#include <filesystem>
#include <string>

namespace zaya::train {

// Copies the SentencePiece model `tokenizer` into run_dir as tokenizer-<crc32c of its bytes>.model
// (atomically; a copy already there with that name is kept) and returns that file name, relative
// to run_dir: what a checkpoint's state records as "tokenizer_copy". Named by content, so a run
// resumed with a different data.tokenizer keeps the one its older checkpoints were trained with.
std::string keep_run_tokenizer(const std::filesystem::path& run_dir, const std::string& tokenizer);
// The name keep_run_tokenizer gives `tokenizer`'s copy, without writing it (ranks other than 0).
std::string run_tokenizer_name(const std::string& tokenizer);

}  // namespace zaya::train
