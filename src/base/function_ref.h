// FunctionRef<R(Args...)>: a reference to a callable for a parameter that is called during
// the call and not kept. Unlike std::function it never allocates: a std::function holding a
// lambda that captures more than two pointers copies it to the heap, once per call of a
// function taking one, and a decode step calls the thread pool about five times a layer.
// The callable must outlive every call through the reference (a lambda written in the
// argument list lives until the call returns).
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace kvllm {

template <class Signature>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> &&
             std::is_invocable_r_v<R, F&, Args...>)
  FunctionRef(F&& f)  // implicit, so that a lambda can be passed where one is taken
      : callable_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* callable, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(callable))(
              std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(callable_, std::forward<Args>(args)...); }

 private:
  void* callable_;
  R (*call_)(void*, Args...);
};

}  // namespace kvllm
