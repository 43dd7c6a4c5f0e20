#include "cli/session.h"

#include <filesystem>
#include <span>

#include "kv/block_record.h"
#include "kv/session_file.h"

namespace kvllm::cli {
namespace {

using nlohmann::json;

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

json IdentityJson(const BlockIdentity& id) {
  return {{"model_identity", Hex(id.model_identity)},
          {"k_type", id.k_format},
          {"v_type", id.v_format},
          {"block_size", id.block_size}};
}

}  // namespace

Status SaveSession(const std::string& path, const Engine& engine, SeqId seq,
                   const std::vector<int32_t>& tokens, int32_t n_computed, const json& extra) {
  const KVCache& kv = engine.kv();
  if (!kv.prefix_cache_enabled()) {
    return Status::Error("sessions need the prefix cache (no --no-prefix-caching or --kv-window)");
  }
  SessionData data;
  json meta = IdentityJson(kv.block_identity());
  meta["model"] = std::filesystem::path(engine.model().file().path()).filename().string();
  meta["tokens"] = tokens;
  meta["extra"] = extra;
  data.metadata = meta.dump(-1, ' ', false, json::error_handler_t::replace);
  const auto computed = std::span<const int32_t>(tokens).first(
      std::min<size_t>(tokens.size(), static_cast<size_t>(std::max(n_computed, 0))));
  for (const BlockRecord& r : kv.ExportBlocks(seq, computed)) data.blocks.push_back(EncodeBlock(r));
  return SaveSessionFile(path, data);
}

StatusOr<std::optional<RestoredSession>> RestoreSession(const std::string& path, Engine& engine) {
  if (!std::filesystem::exists(path)) return std::optional<RestoredSession>();
  KVLLM_ASSIGN_OR_RETURN(SessionData data, LoadSessionFile(path));
  const json meta = json::parse(data.metadata, nullptr, false);
  if (meta.is_discarded() || !meta.is_object() || !meta.contains("tokens") ||
      !meta["tokens"].is_array()) {
    return Status::Error("session " + path + " has no readable metadata");
  }
  KVCache& kv = engine.mutable_kv();
  if (!kv.prefix_cache_enabled()) {
    return Status::Error("sessions need the prefix cache (no --no-prefix-caching or --kv-window)");
  }
  const json want = IdentityJson(kv.block_identity());
  for (const char* key : {"model_identity", "k_type", "v_type", "block_size"}) {
    if (meta.value(key, json()) != want[key]) {
      return Status::Error("session " + path + " was saved by " + meta.value("model", "?") +
                           " with K/V " + meta.value("k_type", "?") + "/" +
                           meta.value("v_type", "?") + " in blocks of " +
                           meta.value("block_size", json()).dump() + " (model " +
                           meta.value("model_identity", "?") + "); this run uses model " +
                           want["model_identity"].get<std::string>() + " with K/V " +
                           want["k_type"].get<std::string>() + "/" +
                           want["v_type"].get<std::string>() + " in blocks of " +
                           want["block_size"].dump() +
                           ": use the same model and -ctk/-ctv/--block-size, or another file");
    }
  }
  RestoredSession out;
  for (const json& t : meta["tokens"]) {
    if (!t.is_number_integer()) return Status::Error("session " + path + " has a bad token");
    out.tokens.push_back(t.get<int32_t>());
  }
  out.extra = meta.value("extra", json::object());
  std::vector<BlockRecord> records;
  for (const auto& bytes : data.blocks) {
    StatusOr<BlockRecord> r = DecodeBlock(bytes);
    if (!r.ok()) return Status::Error("session " + path + ": " + r.status().message());
    records.push_back(std::move(*r));
  }
  out.blocks = kv.ImportBlocks(records);
  return std::optional<RestoredSession>(std::move(out));
}

}  // namespace kvllm::cli
