#include "zaya/dist/mpi_world.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <mutex>
#include <numeric>
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
    case DType::f64: return MPI_DOUBLE;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_sum(DType t) { return t == DType::bf16 ? g_bf16_sum : MPI_SUM; }

namespace {

// Every live Watchdog of the process, so that a rank waiting in one communicator still answers
// census queries on the others (a rank blocked on the dp axis has not vanished from the cp axis).
// MPI is FUNNELED: only one thread polls, but communicators may be made and dropped elsewhere.
std::mutex g_watchdogs_mutex;
std::vector<Watchdog*> g_watchdogs;
std::chrono::steady_clock::time_point g_last_probe{};

}  // namespace

Watchdog::Watchdog(MPI_Comm comm) {
  MPI_Comm_dup(comm, &side_);
  // A peer that died must surface as silence or an error code here, never as an abort.
  MPI_Comm_set_errhandler(side_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(side_, &rank_);
  MPI_Comm_size(side_, &size_);
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Group mine, world;
  MPI_Comm_group(side_, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(size_);
  std::iota(ranks.begin(), ranks.end(), 0);
  world_rank_.resize(size_);
  MPI_Group_translate_ranks(mine, size_, ranks.data(), world, world_rank_.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  if (world_rank_ == ranks && size_ == world_size) world_rank_.clear();
  std::lock_guard<std::mutex> lock(g_watchdogs_mutex);
  g_watchdogs.push_back(this);
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(g_watchdogs_mutex);
    std::erase(g_watchdogs, this);
  }
  if (broken_) return;  // the side communicator may have a dead member; leave it to exit()
  for (Reply& r : replies_) MPI_Wait(&r.request, MPI_STATUS_IGNORE);
  MPI_Comm_free(&side_);
}

void Watchdog::check_usable() const {
  if (broken_)
    throw Error(str("communicator is broken: collective #", broken_seq_, " (", broken_what_,
                    ") failed earlier; exit and restart the job"));
}

void Watchdog::mark_broken(uint64_t seq, const char* what) {
  if (broken_) return;
  broken_ = true;
  broken_seq_ = seq;
  broken_what_ = what;
  mark_mpi_broken();
}

uint64_t Watchdog::begin(const char* /*what*/) {
  check_usable();
  return ++seq_;
}

std::string Watchdog::rank_name(int r) const {
  if (world_rank_.empty()) return std::to_string(r);
  return str(r, " (world rank ", world_rank_[r], ")");
}

// A query carries the asker's collective number; the reply carries the latest one we issued.
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
  // Reap finished replies so the list stays short.
  std::erase_if(replies_, [](Reply& r) {
    int done = 0;
    MPI_Test(&r.request, &done, MPI_STATUS_IGNORE);
    return done != 0;
  });
}

// Answers census queries on every live communicator, at most once per kProbeEvery; returns
// whether it did (the moments at which a wait also looks at its deadline).
static bool census_due() {
  const auto now = std::chrono::steady_clock::now();
  if (now - g_last_probe < kProbeEvery) return false;
  g_last_probe = now;
  std::lock_guard<std::mutex> lock(g_watchdogs_mutex);  // answering never makes or drops one
  for (Watchdog* w : g_watchdogs) w->answer_census();
  return true;
}

// A broken communicator still answers: its rank is alive and has issued its collectives, which a
// peer whose own timeout fires later must not take for a dead rank (two survivors of one missing
// rank time out at slightly different moments). A reply goes only to the asker, which is alive.
void Watchdog::answer_census() { answer_queries(); }

bool Watchdog::poll(const std::function<bool()>& done) {
  check_usable();
  if (done()) return true;
  census_due();
  return false;
}

bool Watchdog::testall(uint64_t seq, const char* what, MPI_Request* requests, int n) {
  int done = 0;
  int rc = MPI_Testall(n, requests, &done, MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) {
    mark_broken(seq, what);
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw Error(str("MPI error in collective #", seq, " (", what, ") on rank ", rank_name(rank_), ": ",
                    std::string(text, len)));
  }
  return done != 0;
}

bool Watchdog::test(uint64_t seq, const char* what, MPI_Request* requests, int n) {
  return poll([&] { return testall(seq, what, requests, n); });
}

void Watchdog::wait(uint64_t seq, const char* what, MPI_Request* requests, int n, double timeout_s,
                    double census_s) {
  wait_until(seq, what, [&] { return testall(seq, what, requests, n); }, timeout_s, census_s);
}

void Watchdog::wait_until(uint64_t seq, const char* what, const std::function<bool()>& done, double timeout_s,
                          double census_s) {
  using clock = std::chrono::steady_clock;
  check_usable();
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  for (int spin = 0;; ++spin) {
    if (done()) return;
    if (census_due() && clock::now() >= deadline) census_and_throw(seq, what, done, timeout_s, census_s);
    // Ranks may outnumber cores (mpirun --oversubscribe): give the core away now and then.
    if ((spin & 63) == 63) sched_yield();
  }
}

void Watchdog::census_and_throw(uint64_t seq, const char* what, const std::function<bool()>& done,
                                double timeout_s, double census_s) {
  using clock = std::chrono::steady_clock;
  mark_broken(seq, what);
  std::vector<uint64_t> query_payload(1, seq);
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
    answer_queries();  // peers that time out too ask us in turn
    census_due();      // and other communicators' peers keep their answers
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
  // deadline passed), but say so. An error from done() now is beside the point.
  bool completed_late = false;
  try {
    completed_late = done();
  } catch (const std::exception&) {
  }

  std::vector<int> silent, behind, missing;
  for (int p = 0; p < size_; ++p) {
    if (answer[p] < 0) silent.push_back(p);
    else if (static_cast<uint64_t>(answer[p]) < seq) behind.push_back(p);
  }
  std::merge(silent.begin(), silent.end(), behind.begin(), behind.end(), std::back_inserter(missing));
  std::ostringstream msg;
  msg << "collective #" << seq << " (" << what << ") on rank " << rank_name(rank_) << " of " << size_
      << " timed out after " << timeout_s << " s: ";
  if (!silent.empty()) {
    msg << (silent.size() == 1 ? "rank " : "ranks ");
    for (size_t i = 0; i < silent.size(); ++i) msg << (i ? ", " : "") << rank_name(silent[i]);
    msg << " never arrived (no answer to a census within " << census_s
        << " s: dead, hung, or busy outside any collective)";
  }
  for (size_t i = 0; i < behind.size(); ++i)
    msg << (silent.empty() && i == 0 ? "" : "; ") << "rank " << rank_name(behind[i])
        << " has not issued it (its latest is collective #" << answer[behind[i]] << ")";
  if (missing.empty()) msg << "every rank has issued it but it did not complete";
  if (completed_late) msg << "; the collective completed during the census";
  throw CollectiveTimeout(msg.str(), missing);
}

}  // namespace zaya::dist::detail
