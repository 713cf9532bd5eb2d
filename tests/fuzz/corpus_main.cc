// The main of a fuzz target built without libFuzzer (a GCC build, as CI's): runs the target once on
// every file of the seed corpora named on the command line, then on deterministic mutations of
// each seed (truncations, byte flips, duplicated and deleted spans), so the suite exercises every
// target on inputs inside and just outside each format in a few seconds. A crash, a trap or an
// exception other than zaya::Error (which the target catches) fails the run, like libFuzzer would.
//   fuzz_<target> CORPUS_DIR... [--mutations N]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<uint8_t> read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// FNV-1a: a seed for each seed file's mutations that is the same on every platform.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The input being run, for the crash handler: it is saved to fuzz-crash-<binary> in the working
// directory, so a failure reproduces with `fuzz_<target> fuzz-crash-fuzz_<target> --mutations 0`.
const uint8_t* g_input = nullptr;
size_t g_input_size = 0;
std::string g_crash_file;

void on_crash(int sig) {
  // Only async-signal-safe calls here.
  const int fd = ::open(g_crash_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    for (size_t done = 0; done < g_input_size;) {
      const ssize_t n = ::write(fd, g_input + done, g_input_size - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  static const char kMsg[] = "fuzz: crashed; the input is saved as ";
  [[maybe_unused]] ssize_t r = ::write(2, kMsg, sizeof kMsg - 1);
  r = ::write(2, g_crash_file.c_str(), g_crash_file.size());
  r = ::write(2, "\n", 1);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void run(const std::vector<uint8_t>& input) {
  g_input = input.data();
  g_input_size = input.size();
  LLVMFuzzerTestOneInput(input.data(), input.size());
}

// One mutation of `seed`; the generator is seeded per seed file, so a failure reproduces.
std::vector<uint8_t> mutate(const std::vector<uint8_t>& seed, std::mt19937_64& rng) {
  std::vector<uint8_t> m = seed;
  const auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  switch (rng() % 5) {
    case 0:  // truncate
      m.resize(pick(m.size() + 1));
      break;
    case 1:  // flip a few bits
      for (int i = 0, k = 1 + static_cast<int>(rng() % 4); i < k && !m.empty(); ++i)
        m[pick(m.size())] ^= static_cast<uint8_t>(1u << (rng() % 8));
      break;
    case 2:  // overwrite a byte with an edge value
      if (!m.empty()) {
        static constexpr uint8_t kEdges[] = {0, 1, 0x7f, 0x80, 0xff, '"', '\n', '[', '=', '-', '9'};
        m[pick(m.size())] = kEdges[rng() % std::size(kEdges)];
      }
      break;
    case 3: {  // duplicate a span
      const size_t a = pick(m.size() + 1), len = std::min(pick(65), m.size() - a);
      std::vector<uint8_t> span(m.begin() + a, m.begin() + a + len);
      m.insert(m.begin() + pick(m.size() + 1), span.begin(), span.end());
      break;
    }
    default: {  // delete a span
      const size_t a = pick(m.size() + 1), len = std::min(pick(65), m.size() - a);
      m.erase(m.begin() + a, m.begin() + a + len);
    }
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  g_crash_file =
      (std::filesystem::current_path() / ("fuzz-crash-" + std::filesystem::path(argv[0]).filename().string()))
          .string();
  for (int sig : {SIGSEGV, SIGABRT, SIGILL, SIGFPE, SIGBUS, SIGTRAP}) std::signal(sig, on_crash);
  std::vector<std::filesystem::path> files;
  long mutations = 200;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mutations" && i + 1 < argc) {
      mutations = std::strtol(argv[++i], nullptr, 10);
      continue;
    }
    if (std::filesystem::is_directory(arg)) {
      for (const auto& e : std::filesystem::directory_iterator(arg))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (std::filesystem::is_regular_file(arg)) {
      files.push_back(arg);
    } else {
      std::fprintf(stderr, "%s: no such file or directory: %s\n", argv[0], arg.c_str());
      return 2;
    }
  }
  // A missing or empty corpus would make the test pass without testing anything.
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR... [--mutations N] (found no seed files)\n", argv[0]);
    return 2;
  }
  std::sort(files.begin(), files.end());
  long runs = 0;
  for (const auto& f : files) {
    const std::vector<uint8_t> seed = read_bytes(f);
    run(seed);
    ++runs;
    std::mt19937_64 rng(fnv1a(f.filename().string()));
    for (long i = 0; i < mutations; ++i, ++runs) run(mutate(seed, rng));
  }
  std::printf("%s: %zu seeds, %ld inputs, no crashes\n", argv[0], files.size(), runs);
  return 0;
}
