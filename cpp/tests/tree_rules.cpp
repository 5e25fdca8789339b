// Known-answer draft trees of the C++ tree builder, driven by tests/test_cpp_host.py, which runs the same cases
// (tests/tree_cases.py) through spot.runtime.tree: one table of cases whose answers are written down, two
// implementations. The cases tie path log-probabilities under different parents, so both hosts must follow the
// stated order rule (docs/decisions.md, "Trees"), not their heap's layout.
//
// stdin, one case per block of lines (states: strings of one-digit token ids):
//   tree BUDGET DEPTH LOOKAHEAD MASK ROOT_STEP ROOT
//   propose STATE LOGP CHILD LOGP CHILD ...     (the scripted proposer's candidates of STATE, best first)
//   end
// stdout per case: "call STATE ..." per proposer call, then "node STATE PARENT STEP CHILDREN" per node in tree
// order (children comma-separated, "-" for none), then "end".
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tree.h"

namespace {

[[noreturn]] void usage(const std::string& what) {
  std::cerr << "tree_rules: " << what << "\n";
  std::exit(64);
}

double number(const std::string& word) {
  char* end = nullptr;
  const double v = std::strtod(word.c_str(), &end);
  if (end == word.c_str() || *end != '\0') usage("not a number: " + word);
  return v;
}

std::vector<int64_t> state_of(const std::string& text) {
  std::vector<int64_t> s;
  for (char c : text) {
    if (c < '0' || c > '9') usage("a state is a string of digits, got " + text);
    s.push_back(c - '0');
  }
  return s;
}

std::string text_of(const std::vector<int64_t>& state) {
  std::string t;
  for (int64_t v : state) t += static_cast<char>('0' + v);
  return t;
}

class ScriptedProposer : public spot::Proposer {
 public:
  ScriptedProposer(std::map<std::string, std::vector<spot::Candidate>> table, int64_t lookahead)
      : table_(std::move(table)), lookahead_(lookahead) {}

  std::vector<std::vector<spot::Candidate>> propose(const std::vector<spot::Node>& tree,
                                                    const std::vector<int64_t>& nodes) override {
    std::vector<std::vector<spot::Candidate>> out;
    std::string call = "call";
    for (int64_t i : nodes) {
      const std::string s = text_of(tree[static_cast<size_t>(i)].state);
      call += " " + s;
      auto it = table_.find(s);
      out.push_back(it == table_.end() ? std::vector<spot::Candidate>{} : it->second);
    }
    calls.push_back(call);
    return out;
  }
  int64_t lookahead() const override { return lookahead_; }

  std::vector<std::string> calls;

 private:
  std::map<std::string, std::vector<spot::Candidate>> table_;
  int64_t lookahead_;
};

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream head(line);
    std::string kind, budget, depth, lookahead, mask, root_step, root;
    head >> kind >> budget >> depth >> lookahead >> mask >> root_step >> root;
    if (kind.empty()) continue;
    if (kind != "tree" || root.empty())
      usage("expected 'tree BUDGET DEPTH LOOKAHEAD MASK ROOT_STEP ROOT', got " + line);
    std::map<std::string, std::vector<spot::Candidate>> table;
    while (std::getline(std::cin, line) && line != "end") {
      std::istringstream in(line);
      std::string word, state, logp, child;
      in >> word >> state;
      if (word != "propose") usage("expected 'propose STATE LOGP CHILD ...' or 'end', got " + line);
      std::vector<spot::Candidate>& cands = table[state];
      while (in >> logp >> child) cands.push_back({number(logp), state_of(child)});
    }
    ScriptedProposer proposer(std::move(table), static_cast<int64_t>(number(lookahead)));
    const std::vector<spot::Node> tree =
        spot::build_tree(state_of(root), static_cast<uint32_t>(number(root_step)), proposer,
                         static_cast<int64_t>(number(budget)), static_cast<int64_t>(number(depth)),
                         static_cast<int64_t>(number(mask)));
    for (const std::string& call : proposer.calls) std::cout << call << "\n";
    for (const spot::Node& n : tree) {
      std::string children;
      for (int64_t c : n.children) children += (children.empty() ? "" : ",") + std::to_string(c);
      std::cout << "node " << text_of(n.state) << " " << n.parent << " " << n.step << " "
                << (children.empty() ? "-" : children) << "\n";
    }
    std::cout << "end\n";
  }
  return 0;
}
