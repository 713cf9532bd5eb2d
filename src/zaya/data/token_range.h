// The token-id range of a dataset, checked against a model's vocabulary before training or
// evaluation starts: an id at or above the vocabulary would otherwise surface only when a batch
// reaches it (hours into a run), inside the embedding, naming neither file nor sequence.
//
// The scan reads the whole memory-mapped .bin once (about a second per few GB from the page cache,
// disk speed when cold). For datasets of at least kTokenRangeCacheMinBytes the result is kept in
// a sidecar PREFIX.token_range, keyed by the size and modification time of PREFIX.bin and
// PREFIX.idx, so later starts skip the scan; a sidecar that does not match (or cannot be written,
// e.g. a read-only dataset directory) only means a scan.
#pragma once

#include <cstdint>
#include <string>

#include "zaya/data/indexed_dataset.h"

namespace zaya::data {

// Below this many .bin bytes a scan takes well under a second, and no sidecar is written.
inline constexpr int64_t kTokenRangeCacheMinBytes = int64_t{1} << 30;

struct TokenRange {
  int64_t min_id = 0, max_id = -1;  // max_id < min_id: the dataset holds no tokens
  bool from_cache = false;          // read from PREFIX.token_range instead of scanned
};

std::string token_range_cache_path(const std::string& prefix);  // PREFIX.token_range

// The smallest and largest token id of `ds`. Datasets of at least cache_min_bytes read and write
// the sidecar cache (tests pass 0 to exercise it on small data).
TokenRange token_range(const IndexedDataset& ds, int64_t cache_min_bytes = kTokenRangeCacheMinBytes);

// Throws a zaya::Error unless every token id of the dataset at `prefix` is in [0, vocab_size).
// The message names the .bin file, the first offending sequence (and its document), the position
// in it, the id, and how many ids are out of range in all.
void check_token_range(const std::string& prefix, int64_t vocab_size);
void check_token_range(const IndexedDataset& ds, int64_t vocab_size);

}  // namespace zaya::data
