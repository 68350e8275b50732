// The trainers' progress line: step, loss, throughput, ms/step and ETA from the recent steps, redrawn in place on a terminal.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

namespace trainer {

class progress {
 public:
  using clock = std::chrono::steady_clock;

  // Steps first_step + 1 .. last_step are to run, each of `items_per_step` items (samples, tokens),
  // reported as "<items_name>/s". On a terminal the line is redrawn in place (carriage return,
  // erase to the end); otherwise each update is a line of its own, fewer of them, for a log file.
  progress(std::FILE* out, std::uint64_t first_step, std::uint64_t last_step, double items_per_step,
           std::string items_name = "samples")
      : out_(out),
        tty_(::isatty(::fileno(out)) == 1),
        first_(first_step),
        last_(last_step),
        items_(items_per_step),
        items_name_(std::move(items_name)),
        interval_(tty_ ? std::chrono::milliseconds(200) : std::chrono::milliseconds(1000)),
        mark_(clock::now()),
        mark_step_(first_step) {}
  progress(const progress&) = delete;
  progress& operator=(const progress&) = delete;
  ~progress() { finish(); }

  bool on_terminal() const { return tty_; }

  // After step `step` (1-based, counted from the start of training, resumed runs included) with the
  // loss to show; `note` follows the line (e.g. a skipped step). Draws the first and the last step,
  // and otherwise at most once per interval. The rates are those of the steps since the last line,
  // not an average since the start, so a slow first step (warm-up) does not linger in them, and the
  // ETA is the remaining steps at that rate.
  void update(std::uint64_t step, double loss, const char* note = "") {
    if (!due(step)) return;
    const auto now = clock::now();
    const double secs = std::chrono::duration<double>(now - mark_).count();
    const double steps = static_cast<double>(step - mark_step_);
    const double per_step = steps > 0 ? secs / steps : 0.0;
    const double eta = per_step * static_cast<double>(last_ - step);
    char line[256];
    std::snprintf(line, sizeof line, "step %*llu/%llu  loss %.4f  %.0f %s/s  %.1f ms/step  ETA %s%s",
                  digits(last_), static_cast<unsigned long long>(step), static_cast<unsigned long long>(last_), loss,
                  per_step > 0 ? items_ / per_step : 0.0, items_name_.c_str(), per_step * 1e3, clock_text(eta).c_str(),
                  note);
    if (tty_) std::fprintf(out_, "\r%s\x1b[K", line);
    else std::fprintf(out_, "%s\n", line);
    std::fflush(out_);
    drawn_ = true;
    mark_ = now;
    mark_step_ = step;
  }

  // Whether update(step, ...) would draw: a trainer whose loss costs a wait (a device copy) asks first.
  bool due(std::uint64_t step) const {
    return step == first_ + 1 || step == last_ || clock::now() - mark_ >= interval_;
  }

  // A line of its own between the progress lines (a checkpoint's report, say).
  void message(const std::string& text) {
    if (tty_ && drawn_) std::fprintf(out_, "\r\x1b[K");
    std::fprintf(out_, "%s\n", text.c_str());
    std::fflush(out_);
    drawn_ = false;
  }

  // Ends the line drawn in place (the next output starts on a line of its own).
  void finish() {
    if (tty_ && drawn_) std::fputc('\n', out_);
    drawn_ = false;
  }

 private:
  static int digits(std::uint64_t v) {
    int d = 1;
    while (v >= 10) {
      v /= 10;
      ++d;
    }
    return d;
  }
  // h:mm:ss, or m:ss under an hour.
  static std::string clock_text(double seconds) {
    const auto s = static_cast<unsigned long long>(seconds + 0.5);
    char buf[32];
    if (s >= 3600) std::snprintf(buf, sizeof buf, "%llu:%02llu:%02llu", s / 3600, s / 60 % 60, s % 60);
    else std::snprintf(buf, sizeof buf, "%llu:%02llu", s / 60, s % 60);
    return buf;
  }

  std::FILE* out_;
  bool tty_;
  std::uint64_t first_, last_;
  double items_;
  std::string items_name_;
  clock::duration interval_;
  clock::time_point mark_;
  std::uint64_t mark_step_;
  bool drawn_ = false;
};

}  // namespace trainer
