// Where phasekv finds its bundled models/, configs/ and data/. In a checkout they are relative
// paths from the repository root (`--model models/kv-chunked`). `cmake --install` copies them to
// PREFIX/share/phasekv beside PREFIX/bin/phasekv (the .deb: /usr/share/phasekv), so that the same
// command works from any directory with the installed binary: a relative path that does not
// exist in the working directory is looked up there. The working directory always wins, so a
// user's own `models/x` is never shadowed.
#pragma once
#include <string>

namespace phasekv {

// The installed data directory relative to the binary's directory (CMakeLists.txt installs the
// binaries to bin/ and the data to share/phasekv/).
inline constexpr const char* kBundledDirFromBinary = "../share/phasekv";

// `path` when it is absolute, empty or exists; else share_dir/path when that exists; else `path`
// unchanged (so that the error names what the user typed).
std::string resolve_bundled(const std::string& path, const std::string& share_dir);

// The same with share_dir = <this executable's directory>/../share/phasekv.
std::string resolve_bundled(const std::string& path);

}  // namespace phasekv
