#include "zaya/data/token_range.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "zaya/core/error.h"
#include "zaya/core/log.h"

namespace zaya::data {
namespace {

constexpr int64_t kChunk = int64_t{1} << 16;  // tokens per read: a 256 KiB buffer per thread
constexpr const char* kCacheMagic = "zaya token range v1";

// What a sidecar is valid for: the exact .bin and .idx it was computed from.
struct FileKey {
  int64_t bin_bytes = -1, bin_mtime_ns = -1, idx_bytes = -1, idx_mtime_ns = -1;
  bool operator==(const FileKey&) const = default;
};

bool stat_file(const std::string& path, int64_t* bytes, int64_t* mtime_ns) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  *bytes = static_cast<int64_t>(st.st_size);
  *mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return true;
}

bool file_key(const std::string& prefix, FileKey* k) {
  return stat_file(bin_path(prefix), &k->bin_bytes, &k->bin_mtime_ns) &&
         stat_file(idx_path(prefix), &k->idx_bytes, &k->idx_mtime_ns);
}

// The cached range when the sidecar exists, parses completely and matches `key`.
bool read_cache(const std::string& path, const FileKey& key, TokenRange* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::string magic;
  if (!std::getline(in, magic) || magic != kCacheMagic) return false;
  FileKey k;
  TokenRange r;
  std::string name;
  int64_t* const fields[] = {&k.bin_bytes, &k.bin_mtime_ns, &k.idx_bytes, &k.idx_mtime_ns, &r.min_id, &r.max_id};
  const char* const names[] = {"bin_bytes", "bin_mtime_ns", "idx_bytes", "idx_mtime_ns", "min_id", "max_id"};
  for (int i = 0; i < 6; ++i)
    if (!(in >> name >> *fields[i]) || name != names[i]) return false;
  if (!(k == key)) return false;
  r.from_cache = true;
  *out = r;
  return true;
}

// Best effort: a dataset directory may be read-only or shared; the scan result stays correct
// without the sidecar, so a failure is only logged.
void write_cache(const std::string& path, const FileKey& k, const TokenRange& r) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kCacheMagic << "\nbin_bytes " << k.bin_bytes << "\nbin_mtime_ns " << k.bin_mtime_ns << "\nidx_bytes "
        << k.idx_bytes << "\nidx_mtime_ns " << k.idx_mtime_ns << "\nmin_id " << r.min_id << "\nmax_id " << r.max_id
        << "\n";
    out.flush();
    if (!out.good()) {
      std::remove(tmp.c_str());
      log_debug(path, ": cannot write the token-range cache; the next start scans again");
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    log_debug(path, ": cannot write the token-range cache; the next start scans again");
  }
}

TokenRange scan(const IndexedDataset& ds) {
  const int64_t n = ds.num_tokens(), chunks = (n + kChunk - 1) / kChunk;
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
#pragma omp parallel
  {
    std::vector<int32_t> buf(static_cast<size_t>(kChunk));
    int32_t tlo = std::numeric_limits<int32_t>::max(), thi = std::numeric_limits<int32_t>::min();
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t first = c * kChunk, count = std::min(kChunk, n - first);
      ds.read_tokens(first, count, buf.data());
      for (int64_t i = 0; i < count; ++i) {
        tlo = std::min(tlo, buf[static_cast<size_t>(i)]);
        thi = std::max(thi, buf[static_cast<size_t>(i)]);
      }
    }
#pragma omp critical
    {
      lo = std::min<int64_t>(lo, tlo);
      hi = std::max<int64_t>(hi, thi);
    }
  }
  TokenRange r;
  if (n > 0) r.min_id = lo, r.max_id = hi;
  return r;
}

// The document holding sequence s: the last d with document_index(d) <= s.
int64_t document_of(const IndexedDataset& ds, int64_t s) {
  int64_t lo = 0, hi = ds.num_documents() - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (ds.document_index(mid) <= s) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace

std::string token_range_cache_path(const std::string& prefix) { return prefix + ".token_range"; }

TokenRange token_range(const IndexedDataset& ds, int64_t cache_min_bytes) {
  const std::string cache = token_range_cache_path(ds.prefix());
  FileKey key;
  const bool cacheable = ds.num_tokens() * token_dtype_size(ds.dtype()) >= cache_min_bytes && file_key(ds.prefix(), &key);
  TokenRange r;
  if (cacheable && read_cache(cache, key, &r)) return r;
  r = scan(ds);
  if (cacheable) write_cache(cache, key, r);
  return r;
}

void check_token_range(const IndexedDataset& ds, int64_t vocab_size) {
  ZAYA_CHECK(vocab_size > 0, "check_token_range: vocab_size must be positive, found ", vocab_size);
  const TokenRange r = token_range(ds);
  if (r.max_id < r.min_id || (r.min_id >= 0 && r.max_id < vocab_size)) return;
  // Out of range somewhere: find the first offending token and count them all (the error path
  // may take a second scan).
  int64_t bad = 0, first_seq = -1, first_pos = 0, first_id = 0;
  std::vector<int32_t> seq;
  for (int64_t s = 0; s < ds.num_sequences(); ++s) {
    seq.resize(static_cast<size_t>(ds.sequence_length(s)));
    ds.read_tokens(ds.sequence_pointer(s) / token_dtype_size(ds.dtype()), static_cast<int64_t>(seq.size()), seq.data());
    for (size_t i = 0; i < seq.size(); ++i) {
      if (seq[i] >= 0 && seq[i] < vocab_size) continue;
      if (bad++ == 0) first_seq = s, first_pos = static_cast<int64_t>(i), first_id = seq[i];
    }
  }
  if (r.from_cache && bad == 0) {  // a stale or edited sidecar: the data itself is fine
    log_warn(token_range_cache_path(ds.prefix()), ": claims ids up to ", r.max_id,
             " but the data holds none outside the vocabulary; delete this file");
    return;
  }
  throw Error(str(bin_path(ds.prefix()), ": sequence ", first_seq, " (document ", document_of(ds, first_seq),
                  "), token ", first_pos, ": id ", first_id, " is outside the model's vocabulary [0, ", vocab_size,
                  "); ", bad, " of the dataset's ", ds.num_tokens(), " tokens are (ids ", r.min_id, "..", r.max_id,
                  "). Was it tokenized for another model? Re-run `zaya data prepare` with this model's tokenizer",
                  r.min_id >= 0 ? str(", or set model.vocab_size to at least ", r.max_id + 1) : std::string()));
}

void check_token_range(const std::string& prefix, int64_t vocab_size) {
  check_token_range(IndexedDataset(prefix), vocab_size);
}

}  // namespace zaya::data
