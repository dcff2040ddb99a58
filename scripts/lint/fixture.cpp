// Findings that clang-tidy must report with scripts/lint/tidy_scope.cpp loaded: scripts/lint.sh
// fails if one is missing. The second needs std::vector's members, which live in a system header
// the plugin keeps out of the walk.
#include <vector>

class Box {
 public:
  int size() const { return size_; }  // modernize-use-nodiscard

 private:
  int size_ = 0;
};

int first_or_zero(const std::vector<int>& items) {
  int value;                        // cppcoreguidelines-init-variables
  if (items.size() == 0) return 0;  // readability-container-size-empty
  value = items.front();
  return value + Box{}.size();
}
