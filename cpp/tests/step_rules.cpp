// Known-answer checks of the C++ commit and filter rules, driven by tests/test_cpp_host.py, which feeds the same
// cases to the numpy runtime (spot.runtime.step): one table of cases whose answers are written down, two
// implementations. End-to-end comparisons on random models never hit a confidence equal to tau or a probability
// mass equal to top-p, so a `>=` for a `>` survived them.
//
// stdin, one case per line (numbers as Python's repr writes them, read back exactly by strtod):
//   filter TOP_K TOP_P z0 z1 ...        -> the kept ids (filter_row: finite outputs), space-separated
//   select static|threshold TAU c0 c1 ... -> the committed indices (select_commits), space-separated
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "step.h"

namespace {

double number(const std::string& word) {
  char* end = nullptr;
  const double v = std::strtod(word.c_str(), &end);
  if (end == word.c_str() || *end != '\0') {
    std::cerr << "step_rules: not a number: " << word << "\n";
    std::exit(64);
  }
  return v;
}

void print(const std::vector<int64_t>& ids) {
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  std::cout << "\n";
}

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string kind, word;
    in >> kind;
    if (kind == "filter") {
      std::string k, p;
      in >> k >> p;
      std::vector<double> z, out;
      while (in >> word) z.push_back(number(word));
      spot::filter_row(z, static_cast<int64_t>(number(k)), number(p), out);
      std::vector<int64_t> kept;
      for (size_t i = 0; i < out.size(); ++i)
        if (std::isfinite(out[i])) kept.push_back(static_cast<int64_t>(i));
      print(kept);
    } else if (kind == "select") {
      std::string mode, tau;
      in >> mode >> tau;
      if (mode != "static" && mode != "threshold") {
        std::cerr << "step_rules: unknown mode: " << mode << " (static or threshold)\n";
        return 64;
      }
      spot::CommitRule rule;
      rule.threshold = mode == "threshold";
      rule.tau = number(tau);
      std::vector<double> conf;
      while (in >> word) conf.push_back(number(word));
      print(spot::select_commits(conf, rule));
    } else {
      std::cerr << "step_rules: unknown case kind: " << kind << "\n";
      return 64;
    }
  }
  return 0;
}
