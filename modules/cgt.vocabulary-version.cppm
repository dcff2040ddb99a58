// cgt.vocabulary:version — which cgt a program was compiled against.
module;
#include <compare>
#include <string_view>

export module cgt.vocabulary:version;

// The numbers are CMake's `project(cgt VERSION ...)`, given to every compile of cgt's module
// interfaces as definitions (src/CMakeLists.txt): cgt's own, and a consumer's through the installed
// package, whose cgtConfigVersion.cmake holds the same version (tests/consumer/version checks both).
#if !defined(CGT_VERSION_MAJOR) || !defined(CGT_VERSION_MINOR) || !defined(CGT_VERSION_PATCH)
#error "cgt's module interfaces are compiled with CGT_VERSION_MAJOR/MINOR/PATCH defined (by cgt's CMake package)"
#endif
#define CGT_STRINGIZE_(x) #x
#define CGT_STRINGIZE(x) CGT_STRINGIZE_(x)

export namespace cgt {

/// A version of cgt, as `find_package(cgt major.minor)` compares it. While `major` is 0, a new
/// `minor` may change the interface (a program for 0.1 may not build against 0.2); a new `patch`
/// never does. Ordered as versions are: `static_assert(cgt::version >= cgt::Version{0, 2, 0})`.
struct Version {
  int major = 0;
  int minor = 0;
  int patch = 0;

  friend constexpr auto operator<=>(const Version&, const Version&) = default;
};

/// The cgt this program was compiled against (its module interfaces, which the installed package
/// pairs with its libraries).
inline constexpr Version version{.major = CGT_VERSION_MAJOR, .minor = CGT_VERSION_MINOR, .patch = CGT_VERSION_PATCH};

/// The same as text, e.g. "0.2.0".
inline constexpr std::string_view version_string =
    CGT_STRINGIZE(CGT_VERSION_MAJOR) "." CGT_STRINGIZE(CGT_VERSION_MINOR) "." CGT_STRINGIZE(CGT_VERSION_PATCH);

}  // namespace cgt
