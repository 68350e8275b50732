// A runner of ranges on threads of their own, as a rank's pool runs them: what the products' tests split their work with.
#pragma once

#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

namespace testing {

// Cuts [0, count) into `parts` uneven ranges (some empty where count is small), each run on a thread of
// its own at once.
struct threads_runner {
  int parts;
  template <class F>
  void operator()(std::size_t count, F&& f) const {
    std::vector<std::size_t> cut{0};
    for (int p = 1; p < parts; ++p) cut.push_back(std::min(count, std::max(cut.back(), count * p / parts + 13 * p)));
    cut.push_back(count);
    std::vector<std::thread> threads;
    for (int p = 0; p < parts; ++p) threads.emplace_back([&, p] { f(cut[p], cut[p + 1]); });
    for (auto& t : threads) t.join();
  }
};

}  // namespace testing
