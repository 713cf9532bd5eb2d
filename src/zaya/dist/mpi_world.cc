#include "zaya/dist/mpi_world.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <sstream>

#include "zaya/core/log.h"

namespace zaya::dist::detail {
namespace {

std::mutex g_mutex;
int g_users = 0;
bool g_we_initialized = false;
bool g_broken = false;
bool g_finalized = false;
MPI_Datatype g_bf16_type = MPI_DATATYPE_NULL;
MPI_Op g_bf16_sum = MPI_OP_NULL;

// inout[i] = bf16(float(in[i]) + float(inout[i])): the sum is formed in fp32 and rounded once,
// so each pairwise combine in MPI's reduction tree costs one bf16 rounding, as on NCCL.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = to_bf16(to_float(a[i]) + to_float(b[i]));
}

constexpr int kQueryTag = 7001;
constexpr int kReplyTag = 7002;
constexpr auto kProbeEvery = std::chrono::milliseconds(1);

}  // namespace

void acquire_mpi() {
  std::lock_guard<std::mutex> lock(g_mutex);
  ZAYA_CHECK(!g_finalized, "MPI was already finalized in this process; it cannot be started again");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    // FUNNELED: only the thread that made the communicator calls MPI.
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    g_we_initialized = true;
  }
  if (g_bf16_type == MPI_DATATYPE_NULL) {
    MPI_Type_contiguous(2, MPI_BYTE, &g_bf16_type);
    MPI_Type_commit(&g_bf16_type);
    MPI_Op_create(&bf16_sum, /*commute=*/1, &g_bf16_sum);
  }
  ++g_users;
}

void release_mpi() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (--g_users > 0 || g_broken || !g_we_initialized) return;
  MPI_Op_free(&g_bf16_sum);
  MPI_Type_free(&g_bf16_type);
  MPI_Finalize();
  g_finalized = true;
}

void mark_mpi_broken() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_broken = true;
}

MPI_Datatype mpi_datatype(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::bf16: return g_bf16_type;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_sum(DType t) { return t == DType::bf16 ? g_bf16_sum : MPI_SUM; }

Watchdog::Watchdog(MPI_Comm world) {
  MPI_Comm_dup(world, &side_);
  // A peer that died must surface as silence or an error code here, never as an abort.
  MPI_Comm_set_errhandler(side_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(side_, &rank_);
  MPI_Comm_size(side_, &size_);
}

Watchdog::~Watchdog() {
  if (broken_) return;  // the side communicator may have a dead member; leave it to exit()
  for (Reply& r : replies_) MPI_Wait(&r.request, MPI_STATUS_IGNORE);
  MPI_Comm_free(&side_);
}

void Watchdog::check_usable() const {
  if (broken_)
    throw Error(str("communicator is broken: collective #", seq_, " (", what_,
                    ") timed out earlier; exit and restart the job"));
}

void Watchdog::begin(const char* what) {
  check_usable();
  ++seq_;
  what_ = what;
}

// A query carries the asker's collective number; the reply carries ours and whether we are
// waiting inside one (we only ever answer from inside a wait, so always 1).
void Watchdog::answer_queries() {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, side_, &flag, &st) != MPI_SUCCESS || !flag) break;
    uint64_t asked = 0;
    MPI_Recv(&asked, 1, MPI_UINT64_T, st.MPI_SOURCE, kQueryTag, side_, MPI_STATUS_IGNORE);
    // std::list keeps the payload's address fixed until the send completes.
    Reply& r = replies_.emplace_back();
    r.payload = seq_;
    MPI_Isend(&r.payload, 1, MPI_UINT64_T, st.MPI_SOURCE, kReplyTag, side_, &r.request);
  }
  // Reap finished replies so the vector stays short.
  std::erase_if(replies_, [](Reply& r) {
    int done = 0;
    MPI_Test(&r.request, &done, MPI_STATUS_IGNORE);
    return done != 0;
  });
}

void Watchdog::wait(MPI_Request* requests, int n, double timeout_s, double census_s) {
  wait_until(
      [&] {
        int done = 0;
        int rc = MPI_Testall(n, requests, &done, MPI_STATUSES_IGNORE);
        ZAYA_CHECK(rc == MPI_SUCCESS, "MPI error in collective #", seq_, " (", what_, "): code ", rc);
        return done != 0;
      },
      timeout_s, census_s);
}

void Watchdog::wait_until(const std::function<bool()>& done, double timeout_s, double census_s) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  for (int spin = 0;; ++spin) {
    if (done()) return;
    auto now = clock::now();
    if (now - last_probe_ >= kProbeEvery) {
      last_probe_ = now;
      answer_queries();
      if (now >= deadline) census_and_throw(done, timeout_s, census_s);
    }
    // Ranks may outnumber cores (mpirun --oversubscribe): give the core away now and then.
    if ((spin & 63) == 63) sched_yield();
  }
}

void Watchdog::census_and_throw(const std::function<bool()>& done, double timeout_s, double census_s) {
  using clock = std::chrono::steady_clock;
  broken_ = true;
  mark_mpi_broken();
  std::vector<uint64_t> query_payload(1, seq_);
  std::vector<MPI_Request> queries;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    queries.emplace_back();
    if (MPI_Isend(query_payload.data(), 1, MPI_UINT64_T, p, kQueryTag, side_, &queries.back()) != MPI_SUCCESS)
      queries.pop_back();
  }
  std::vector<int64_t> answer(size_, -1);  // -1: no reply
  answer[rank_] = static_cast<int64_t>(seq_);
  const auto end = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(census_s));
  int answered = 1;
  while (clock::now() < end && answered < size_) {
    answer_queries();
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kReplyTag, side_, &flag, &st) == MPI_SUCCESS && flag) {
      uint64_t theirs = 0;
      MPI_Recv(&theirs, 1, MPI_UINT64_T, st.MPI_SOURCE, kReplyTag, side_, MPI_STATUS_IGNORE);
      if (answer[st.MPI_SOURCE] < 0) ++answered;
      answer[st.MPI_SOURCE] = static_cast<int64_t>(theirs);
    } else {
      sched_yield();
    }
  }
  // A late arrival may have completed the collective after all; that is still a timeout (the
  // deadline passed), but say so.
  bool completed_late = done();

  std::vector<int> missing, elsewhere;
  for (int p = 0; p < size_; ++p) {
    if (answer[p] < 0) missing.push_back(p);
    else if (static_cast<uint64_t>(answer[p]) != seq_) elsewhere.push_back(p);
  }
  std::ostringstream msg;
  msg << "collective #" << seq_ << " (" << what_ << ") on rank " << rank_ << " of " << size_
      << " timed out after " << timeout_s << " s: ";
  auto list = [&](const std::vector<int>& ranks) {
    for (size_t i = 0; i < ranks.size(); ++i) msg << (i ? ", " : "") << ranks[i];
  };
  if (!missing.empty()) {
    msg << (missing.size() == 1 ? "rank " : "ranks ");
    list(missing);
    msg << " never arrived (no answer to a census within " << census_s << " s: dead, hung, or busy outside any collective)";
  } else {
    msg << "every rank answered the census but the collective did not complete";
  }
  for (int p : elsewhere)
    msg << "; rank " << p << " is waiting in collective #" << answer[p] << " instead";
  if (completed_late) msg << "; the collective completed during the census";
  throw CollectiveTimeout(msg.str(), missing);
}

}  // namespace zaya::dist::detail
