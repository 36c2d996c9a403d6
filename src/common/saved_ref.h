// A typed reference to a long-lived object (the model, a frozen NF4 weight) kept in an autograd
// context's saved_data: an IValue capsule holding T*, read back as T* — never an integer that
// has to be cast back to a pointer. The object must outlive every graph that saved it.
#pragma once
#include <ATen/core/ivalue.h>

#include <vector>

namespace ptrain {

template <class T>
struct SavedRef : torch::CustomClassHolder {
  explicit SavedRef(T* p) : ptr(p) {}
  T* ptr;
};

template <class T>
c10::IValue saved_ref(T* object) {
  return c10::IValue::make_capsule(c10::make_intrusive<SavedRef<T>>(object));
}

template <class T>
T* saved_ref_of(const c10::IValue& value) {
  return static_cast<SavedRef<T>*>(value.toCapsule().get())->ptr;
}

// The same for several objects at once: a capsule holding a vector of T*.
template <class T>
struct SavedRefs : torch::CustomClassHolder {
  explicit SavedRefs(std::vector<T*> p) : ptrs(std::move(p)) {}
  std::vector<T*> ptrs;
};

template <class T>
c10::IValue saved_refs(std::vector<T*> objects) {
  return c10::IValue::make_capsule(c10::make_intrusive<SavedRefs<T>>(std::move(objects)));
}

template <class T>
const std::vector<T*>& saved_refs_of(const c10::IValue& value) {
  return static_cast<SavedRefs<T>*>(value.toCapsule().get())->ptrs;
}

}  // namespace ptrain
