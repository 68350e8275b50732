// The GPT example's data: text files read at run time, a byte-level vocabulary, a held-out split and counter-based batches.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "mlp.hpp"  // mlp::key: the counter-based generator both examples use
#include "zero/error.hpp"

namespace gpt {

// The corpus as tokens. A "character" is a byte: UTF-8 text stays exact, and a multi-byte character
// is a few tokens. The vocabulary is the set of bytes that occur, in ascending order, so the same
// files always give the same token ids.
struct corpus {
  std::vector<std::string> files;  // what was read, in order
  std::string text;                // their contents, concatenated
  std::string vocab;               // vocab[id] is the byte of token id
  std::array<int, 256> id{};       // the token id of a byte, -1 where the byte never occurs
  std::vector<int> tokens;         // the text's tokens reordered: the training blocks, then the held-out ones
  std::size_t train_end = 0;       // tokens [0, train_end) train, [train_end, size) are held out

  int vocab_size() const { return static_cast<int>(vocab.size()); }
  std::size_t train_size() const { return train_end; }
  std::size_t held_out_size() const { return tokens.size() - train_end; }
};

// The files a --data path stands for: a file itself; a directory, its *.md and *.txt files (not
// recursive) in byte order of their names, so a listing order never changes the corpus.
inline std::vector<std::filesystem::path> corpus_files(const std::filesystem::path& p) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) return {p};
  ZERO_CHECK(fs::is_directory(p, ec), io, "corpus: '", p.string(), "' is neither a file nor a directory");
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(p)) {
    const auto ext = entry.path().extension();
    if (entry.is_regular_file() && (ext == ".md" || ext == ".txt")) out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  ZERO_CHECK(!out.empty(), io, "corpus: the directory '", p.string(), "' holds no .md or .txt file");
  return out;
}

// The text is cut into this many equal blocks, and a `held_out` fraction of them, evenly spread, is
// held out. Why not a tail, as nanoGPT holds out: a corpus of several files is not uniform (the
// tail of this repository's docs is mostly C++), and a tail would measure another distribution.
inline constexpr std::size_t split_blocks = 100;

// Reads the paths in order, builds the vocabulary and splits the tokens: block j of split_blocks is
// held out when floor((j + 1) h) > floor(j h), h = held_out; the training blocks come first in
// `tokens`, in text order, then the held-out ones (a window may span the seam between two blocks of
// one part: a few positions out of a block's length). Both parts must hold `context` + 1 tokens.
inline corpus load_corpus(const std::vector<std::string>& paths, double held_out, int context) {
  corpus c;
  for (const auto& p : paths)
    for (const auto& f : corpus_files(p)) {
      std::ifstream in(f, std::ios::binary);
      ZERO_CHECK(in.good(), io, "corpus: cannot open '", f.string(), "'");
      std::ostringstream s;
      s << in.rdbuf();
      c.files.push_back(f.string());
      c.text += s.str();
    }
  std::array<bool, 256> seen{};
  for (unsigned char ch : c.text) seen[ch] = true;
  c.id.fill(-1);
  for (int b = 0; b < 256; ++b)
    if (seen[static_cast<std::size_t>(b)]) {
      c.id[static_cast<std::size_t>(b)] = static_cast<int>(c.vocab.size());
      c.vocab.push_back(static_cast<char>(b));
    }
  const std::size_t n = c.text.size();
  std::vector<int> held;
  c.tokens.reserve(n);
  for (std::size_t j = 0; j < split_blocks; ++j) {
    const bool out = std::floor(static_cast<double>(j + 1) * held_out) > std::floor(static_cast<double>(j) * held_out);
    for (std::size_t i = j * n / split_blocks; i < (j + 1) * n / split_blocks; ++i)
      (out ? held : c.tokens).push_back(c.id[static_cast<unsigned char>(c.text[i])]);
  }
  c.train_end = c.tokens.size();
  c.tokens.insert(c.tokens.end(), held.begin(), held.end());
  const auto need = static_cast<std::size_t>(context) + 1;
  ZERO_CHECK(c.train_size() >= need && c.held_out_size() >= need, invalid_argument, "corpus: ", c.tokens.size(),
             " bytes split into ", c.train_size(), " for training and ", c.held_out_size(),
             " held out, but each part needs at least --context + 1 = ", need);
  return c;
}

// The unigram entropy, in nats, of tokens [begin, end): -sum p ln p over their own frequencies.
// The cross-entropy of the best model that ignores context, on exactly these tokens: a language
// model has learned something about context when its loss falls below it.
inline double unigram_entropy(const corpus& c, std::size_t begin, std::size_t end) {
  std::vector<std::size_t> count(c.vocab.size(), 0);
  for (std::size_t i = begin; i < end; ++i) ++count[static_cast<std::size_t>(c.tokens[i])];
  double h = 0.0;
  const double n = static_cast<double>(end - begin);
  for (std::size_t k : count)
    if (k > 0) h -= static_cast<double>(k) / n * std::log(static_cast<double>(k) / n);
  return h;
}

// Where training sequence `k` of step `step` starts in the training part: a pure function of the
// seed, the step and k (the counter-based generator), so every rank, stage and world size draws the
// same sequences, and a resumed run continues with the batches an uninterrupted one would see.
inline std::size_t train_window(const corpus& c, int context, std::uint64_t seed, std::uint64_t step, std::uint64_t k) {
  const std::uint64_t starts = c.train_size() - static_cast<std::size_t>(context);  // windows of context + 1
  return static_cast<std::size_t>(mlp::key(seed, 5, step, k) % starts);
}

// The starts of `count` evaluation windows in tokens [begin, end): non-overlapping, evenly spread
// (all of them when count is 0 or more than fit).
inline std::vector<std::size_t> eval_windows(std::size_t begin, std::size_t end, int context, std::size_t count) {
  const std::size_t fit = (end - begin - 1) / static_cast<std::size_t>(context);
  const std::size_t n = count == 0 ? fit : std::min(count, fit);
  std::vector<std::size_t> out;
  for (std::size_t j = 0; j < n; ++j) out.push_back(begin + (j * fit / n) * static_cast<std::size_t>(context));
  return out;
}

}  // namespace gpt
