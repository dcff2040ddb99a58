// A clang plugin for clang-tidy 19 (scripts/lint.sh loads it with --load): before the checks run
// on a translation unit, it limits the AST they walk to the declarations outside system headers.
//
// Why: clang-tidy walks every declaration of the unit, and reports only those outside system
// headers (SystemHeaders: false). A unit of cgt has the standard library (and libtorch) in its
// global module fragment, and again in the fragment of every module it imports, so most of the
// walk was over code whose findings are thrown away: a core unit took 20 s, of which 4 s were the
// parse. clang-tidy 21 skips system headers the same way on its own.
//
// The findings are the same with it as without (scripts/lint/compare-scope.sh compares them, every
// check on).
//
// How: clang runs a plugin's consumer of kind AddBeforeMainAction before the main action's, and
// the walk of clang-tidy's matchers covers the ASTContext's traversal scope only (clangd uses the
// same scope to check the main file alone).
#include <clang/AST/ASTConsumer.h>
#include <clang/AST/ASTContext.h>
#include <clang/AST/Decl.h>
#include <clang/Basic/SourceManager.h>
#include <clang/Frontend/CompilerInstance.h>
#include <clang/Frontend/FrontendPluginRegistry.h>

#include <memory>
#include <string>
#include <vector>

namespace {

class OutsideSystemHeaders final : public clang::ASTConsumer {
 public:
  void HandleTranslationUnit(clang::ASTContext& context) override {
    const clang::SourceManager& sources = context.getSourceManager();
    std::vector<clang::Decl*> scope;
    for (clang::Decl* decl : context.getTranslationUnitDecl()->decls()) {
      if (!sources.isInSystemHeader(decl->getLocation())) scope.push_back(decl);
    }
    context.setTraversalScope(scope);
  }
};

class LimitTraversalScope final : public clang::PluginASTAction {
 protected:
  std::unique_ptr<clang::ASTConsumer> CreateASTConsumer(clang::CompilerInstance& /*compiler*/,
                                                        llvm::StringRef /*file*/) override {
    return std::make_unique<OutsideSystemHeaders>();
  }
  bool ParseArgs(const clang::CompilerInstance& /*compiler*/, const std::vector<std::string>& /*args*/) override {
    return true;
  }
  ActionType getActionType() override { return AddBeforeMainAction; }
};

const clang::FrontendPluginRegistry::Add<LimitTraversalScope> registration(
    "cgt-tidy-scope", "clang-tidy's checks walk the declarations outside system headers only");

}  // namespace
