#include "util/manifest.h"

#include <openssl/evp.h>

#include <cstdint>
#include <filesystem>

#include "util/error.h"
#include "util/fs.h"

namespace phasekv {

using json = nlohmann::json;

std::string sha256_hex(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &n, EVP_sha256(), nullptr) != 1)
    throw Error("internal: SHA-256 failed (OpenSSL)");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out.push_back(hex[digest[i] >> 4]);
    out.push_back(hex[digest[i] & 15]);
  }
  return out;
}

std::vector<ManifestFile> read_manifest_files(const std::string& manifest_path,
                                              const std::string& if_changed) {
  const json m = read_json_file(manifest_path);
  if (!m.is_object() || !m.contains("files") || !m["files"].is_array() || m["files"].empty())
    throw Error(manifest_path + ": 'files' must be a non-empty list of {path, bytes, sha256}");
  std::vector<ManifestFile> out;
  for (size_t i = 0; i < m["files"].size(); ++i) {
    const json& f = m["files"][i];
    const std::string where = manifest_path + ": files[" + std::to_string(i) + "]";
    if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("bytes") ||
        !f["bytes"].is_number_unsigned() || !f.contains("sha256") || !f["sha256"].is_string())
      throw Error(where + " must be {\"path\": string, \"bytes\": integer, \"sha256\": hex}");
    const std::string path = f["path"];
    if (!std::filesystem::is_regular_file(path))
      throw Error(where + ": " + path +
                  " does not exist (a Debian package's file: is the package "
                  "installed?)");
    std::string text = read_file(path);
    const auto want_bytes = f["bytes"].get<uint64_t>();
    const std::string digest = sha256_hex(text);
    if (text.size() != want_bytes || digest != f["sha256"].get<std::string>())
      throw Error(where + ": " + path + " has changed: " + std::to_string(text.size()) +
                  " bytes, SHA-256 " + digest + "; the manifest pins " +
                  std::to_string(want_bytes) + " bytes, SHA-256 " + f["sha256"].get<std::string>() +
                  " (" + if_changed + ")");
    out.push_back({path, std::move(text), f});
  }
  return out;
}

}  // namespace phasekv
