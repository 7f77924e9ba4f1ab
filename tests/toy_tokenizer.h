// A BPE-like toy tokenizer for the text-task tests and the fake servers (test_http.cpp,
// test_audit_llamacpp.cpp): " word" with its space, digits in groups of up to three (the space
// before them a token of its own, as in Llama 3), "\n\n" one token and, when
// `merge_dot_newline`, ".\n" one token (so spliced pieces re-tokenize differently). Pieces that
// are not text (a lone UTF-8 lead byte) can be added with id().
#pragma once
#include <cctype>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/http_text_task.h"

namespace phasekv::test {

class ToyTokenizer {
 public:
  explicit ToyTokenizer(bool merge_dot_newline) : merge_(merge_dot_newline) { id("<s>"); }
  std::vector<int32_t> encode(const std::string& text, bool add_special) {
    std::vector<int32_t> out;
    if (add_special) out.push_back(0);
    for (size_t i = 0; i < text.size();) {
      size_t n = 1;
      auto alpha = [&](size_t k) {
        return k < text.size() && std::isalpha((unsigned char)text[k]);
      };
      auto digit = [&](size_t k) {
        return k < text.size() && std::isdigit((unsigned char)text[k]);
      };
      if (text.compare(i, 2, "\n\n") == 0 || (merge_ && text.compare(i, 2, ".\n") == 0)) {
        n = 2;
      } else if (alpha(i) || (text[i] == ' ' && alpha(i + 1))) {
        n = text[i] == ' ' ? 2 : 1;
        while (alpha(i + n)) ++n;
      } else if (digit(i)) {
        while (n < 3 && digit(i + n)) ++n;
      }
      out.push_back(id(text.substr(i, n)));
      i += n;
    }
    return out;
  }
  std::string decode(const std::vector<int32_t>& ids) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string s;
    for (int32_t t : ids)
      if (t > 0) s += words_.at(static_cast<size_t>(t));
    return s;
  }
  TextTokenizerFns fns() {
    return {[this](const std::vector<std::string>& texts, bool special) {
              std::vector<std::vector<int32_t>> out;
              for (const auto& t : texts) out.push_back(encode(t, special));
              return out;
            },
            [this](const std::vector<std::vector<int32_t>>& ids) {
              std::vector<std::string> out;
              for (const auto& i : ids) out.push_back(decode(i));
              return out;
            }};
  }
  int32_t id(const std::string& w) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = ids_.find(w);
    if (it != ids_.end()) return it->second;
    words_.push_back(w);
    return ids_[w] = static_cast<int32_t>(words_.size() - 1);
  }

 private:
  bool merge_;
  std::mutex mutex_;
  std::vector<std::string> words_;
  std::map<std::string, int32_t> ids_;
};

}  // namespace phasekv::test
