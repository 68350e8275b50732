// The command-line layer every tool shares (trainers, zero_plan, zero_export): exact values, one kind of usage error.
//
// Every flag value is converted here (std::from_chars, never strtoull or long double) and what is
// range-checked is the value the program then uses; every usage error is one escaped message, the
// usage and exit status 2. The files the tools name are tool_files.hpp's. Not library API: the
// tools' own conventions.
#pragma once

#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tool_files.hpp"
#include "zero/error.hpp"

namespace toolcli {

// The exit status of every usage error (a bad flag, value, combination or path), in every tool.
inline constexpr int usage_exit = 2;

// ---- numbers, converted exactly and checked as used -------------------------------------------

// A decimal integer of type T in [min, max]: no wrap-around (a '-' is refused for unsigned types,
// 2^64 is out of range, not 2^64 - 1), no trailing text, a leading '+' allowed.
template <class T>
T integer_value(const std::string& flag, const std::string& text, T min, T max) {
  static_assert(std::is_integral_v<T>);
  const std::string range = "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
  const char* first = text.data();
  const char* last = first + text.size();
  if (first != last && *first == '+') ++first;
  T v{};
  const auto [end, ec] = std::from_chars(first, last, v);
  if (ec == std::errc::result_out_of_range) throw CLI::ValidationError(flag, quote(text) + " is outside " + range);
  if (ec != std::errc() || end != last || first == last)
    throw CLI::ValidationError(flag, quote(text) + " is not a decimal integer in " + range);
  if (v < min || v > max) throw CLI::ValidationError(flag, quote(text) + " is outside " + range);
  return v;
}

// A decimal integer in [0, 2^64 - 1]: no sign, no wrap-around.
inline std::uint64_t uint64_flag(const std::string& flag, const std::string& text) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    throw CLI::ValidationError(flag, quote(text) + " is not a decimal integer in [0, 18446744073709551615]");
  return v;
}

// A decimal number as the 32-bit float the program uses: finite, > 0 (or >= 0 with zero_ok) and at
// most `max` (2^64 is a finite float, but no learning rate or clipping norm).
inline float float_flag(const std::string& flag, const std::string& text, bool zero_ok, float max) {
  const char* first = text.data();
  const char* last = first + text.size();
  if (first != last && *first == '+') ++first;  // from_chars takes no plus sign
  float v = 0.0f;
  const auto [end, ec] = std::from_chars(first, last, v);
  if (ec == std::errc::result_out_of_range)  // it would round to infinity or to 0
    throw CLI::ValidationError(flag,
                               quote(text) + " is outside the range of a 32-bit float (magnitude 1.4e-45 to 3.4e+38)");
  if (ec != std::errc() || end != last || first == last)
    throw CLI::ValidationError(flag, quote(text) + " is not a number");
  if (!std::isfinite(v)) throw CLI::ValidationError(flag, quote(text) + " is not a finite number");
  if (zero_ok ? !(v >= 0.0f) : !(v > 0.0f))
    throw CLI::ValidationError(flag, "must be " + std::string(zero_ok ? ">= 0" : "> 0") + ", got " + quote(text));
  if (v > max) {
    char bound[32];
    std::snprintf(bound, sizeof bound, "%g", static_cast<double>(max));
    throw CLI::ValidationError(flag, "must be at most " + std::string(bound) + ", got " + quote(text));
  }
  return v;
}

// A decimal number as a double in [min, max] (nan, inf and out-of-range refused).
inline double double_value(const std::string& flag, const std::string& text, double min, double max) {
  const char* first = text.data();
  const char* last = first + text.size();
  if (first != last && *first == '+') ++first;
  double v = 0;
  const auto [end, ec] = std::from_chars(first, last, v);
  char range[96];
  std::snprintf(range, sizeof range, "[%g, %g]", min, max);
  if (ec == std::errc::result_out_of_range || (ec == std::errc() && end == last && first != last && std::isinf(v)))
    throw CLI::ValidationError(flag, quote(text) + " is outside " + range);
  if (ec != std::errc() || end != last || first == last || !std::isfinite(v))
    throw CLI::ValidationError(flag, quote(text) + " is not a finite number");
  if (!(v >= min && v <= max)) throw CLI::ValidationError(flag, quote(text) + " is outside " + range);
  return v;
}

// A byte count: a decimal integer and an optional unit, B, kB/MB/GB/TB/PB (powers of 1000) or
// KiB/MiB/GiB/TiB/PiB (powers of 1024), in any case; the product must fit 64 bits.
inline std::uint64_t size_value(const std::string& flag, const std::string& text) {
  const char* first = text.data();
  const char* last = first + text.size();
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(first, last, v);
  const std::string form =
      " is not a byte count (a decimal integer, optionally with B, kB, MB, GB, TB, PB, KiB, "
      "MiB, GiB, TiB or PiB)";
  if (ec == std::errc::result_out_of_range)
    throw CLI::ValidationError(flag, quote(text) + " is more than 2^64 - 1 bytes");
  if (ec != std::errc() || first == last || end == first) throw CLI::ValidationError(flag, quote(text) + form);
  std::string unit(end, last);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::pair<const char*, std::uint64_t> units[] = {{"", 1},
                                                                {"b", 1},
                                                                {"kb", 1000},
                                                                {"mb", 1000000},
                                                                {"gb", 1000000000},
                                                                {"tb", 1000000000000},
                                                                {"pb", 1000000000000000},
                                                                {"kib", 1ull << 10},
                                                                {"mib", 1ull << 20},
                                                                {"gib", 1ull << 30},
                                                                {"tib", 1ull << 40},
                                                                {"pib", 1ull << 50}};
  for (const auto& [name, scale] : units)
    if (unit == name) {
      std::uint64_t bytes = 0;
      if (__builtin_mul_overflow(v, scale, &bytes))
        throw CLI::ValidationError(flag, quote(text) + " is more than 2^64 - 1 bytes");
      return bytes;
    }
  throw CLI::ValidationError(flag, quote(text) + form);
}

// The registrations: an option whose value goes through the conversions above. The default shown
// in --help is the target's value at registration.
template <class T>
CLI::Option* add_integer(CLI::App& app, const std::string& names, T& target, T min, T max, const std::string& help) {
  const std::string flag = flag_name(names);
  return app
      .add_option_function<std::string>(
          names, [&target, flag, min, max](const std::string& v) { target = integer_value<T>(flag, v, min, max); },
          help)
      ->type_name(std::is_signed_v<T> ? "INT" : "UINT")
      ->default_str(std::to_string(target));
}

inline CLI::Option* add_double(CLI::App& app, const std::string& names, double& target, double min, double max,
                               const std::string& help) {
  const std::string flag = flag_name(names);
  char shown[32];
  std::snprintf(shown, sizeof shown, "%g", target);
  return app
      .add_option_function<std::string>(
          names, [&target, flag, min, max](const std::string& v) { target = double_value(flag, v, min, max); }, help)
      ->type_name("FLOAT")
      ->default_str(shown);
}

// A 32-bit float in [min, max], converted exactly as a float (1e39 is out of range, not inf).
inline CLI::Option* add_float(CLI::App& app, const std::string& names, float& target, float min, float max,
                              const std::string& help) {
  const std::string flag = flag_name(names);
  char shown[32];
  std::snprintf(shown, sizeof shown, "%g", static_cast<double>(target));
  return app
      .add_option_function<std::string>(
          names,
          [&target, flag, min, max](const std::string& v) {
            const double d = double_value(flag, v, min, max);
            if (d != 0 && std::fabs(d) < static_cast<double>(std::numeric_limits<float>::denorm_min()))
              throw CLI::ValidationError(flag, quote(v) + " rounds to 0 as a 32-bit float");
            target = static_cast<float>(d);
          },
          help)
      ->type_name("FLOAT")
      ->default_str(shown);
}

// A comma-separated list of integers, each in [min, max]; at least one.
template <class T>
CLI::Option* add_integer_list(CLI::App& app, const std::string& names, std::vector<T>& target, T min, T max,
                              const std::string& help) {
  const std::string flag = flag_name(names);
  std::string shown;
  for (const T& v : target) shown += (shown.empty() ? "" : ",") + std::to_string(v);
  return app
      .add_option_function<std::vector<std::string>>(
          names,
          [&target, flag, min, max](const std::vector<std::string>& values) {
            std::vector<T> out;
            for (const auto& v : values) out.push_back(integer_value<T>(flag, v, min, max));
            if (out.empty()) throw CLI::ValidationError(flag, "give at least one value");
            target = std::move(out);
          },
          help)
      ->delimiter(',')
      ->type_name("INT,...")
      ->default_str(shown);
}

// A CLI::IsMember that quotes the value escaped (CLI11's own prints it raw).
inline CLI::Validator one_of(std::vector<std::string> names) {
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  return CLI::Validator(
      [names, list](std::string& v) -> std::string {
        for (const auto& n : names)
          if (v == n) return "";
        return quote(v) + " is not one of " + list;
      },
      "{" + list + "}");
}

// ---- parsing and usage errors ------------------------------------------------------------------

// A usage error: the message (escaped), a blank line, the usage; exit status 2.
inline int usage_error(const CLI::App& app, const std::string& message) {
  std::cerr << "error: " << printable_message(message) << "\n\n" << app.help();
  return usage_exit;
}

// Parses the command line; returns the exit status when the program should stop here (0 after
// --help, 2 after any usage error, whatever CLI11's own code for it), nothing when it should go on.
inline std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return usage_error(app, e.what());
  }
  return std::nullopt;
}

// A CLI11 check from a `problem(text)` function ("" when the value is fine); the option's name
// prefixes the message.
template <class Problem>
CLI::Validator checked(Problem problem, const char* what) {
  return CLI::Validator([problem](std::string& text) { return problem(text); }, "PATH", what);
}

}  // namespace toolcli
