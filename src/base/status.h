// Status and StatusOr: the error channel for everything a user can cause (a bad file, a full
// pool, a bad request). Invariants the code itself guarantees use KVLLM_CHECK instead.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace kvllm {

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  static Status Ok() { return Status(); }
  static Status Error(std::string message) {
    Status s;
    s.message_ = std::move(message);
    s.ok_ = false;
    return s;
  }
  bool ok() const { return ok_; }
  const std::string& message() const { return message_; }

 private:
  bool ok_ = true;
  std::string message_;
};

// Holds either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = Status::Error("StatusOr built from an OK status without a value");
  }
  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

[[noreturn]] inline void CheckFailed(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "kvllm: internal check failed: %s at %s:%d\n", expr, file, line);
  std::abort();
}

}  // namespace kvllm

#define KVLLM_CHECK(cond) \
  ((cond) ? (void)0 : ::kvllm::CheckFailed(#cond, __FILE__, __LINE__))

// Returns the Status of `expr` from the enclosing function when it is not OK.
#define KVLLM_RETURN_IF_ERROR(expr)            \
  do {                                         \
    ::kvllm::Status status_macro_ = (expr);    \
    if (!status_macro_.ok()) return status_macro_; \
  } while (0)

#define KVLLM_CONCAT_INNER_(a, b) a##b
#define KVLLM_CONCAT_(a, b) KVLLM_CONCAT_INNER_(a, b)
// Assigns the value of a StatusOr expression to `lhs`, or returns its Status.
#define KVLLM_ASSIGN_OR_RETURN(lhs, expr) \
  KVLLM_ASSIGN_OR_RETURN_IMPL_(KVLLM_CONCAT_(status_or_, __LINE__), lhs, expr)
#define KVLLM_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                                 \
  if (!var.ok()) return var.status();                \
  lhs = std::move(var.value())

