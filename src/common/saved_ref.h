// A typed reference to a long-lived object (the model, a frozen NF4 weight) kept in an autograd
// context's saved_data: an IValue capsule holding T*, read back as T* — never an integer that
// has to be cast back to a pointer. The object must outlive every graph that saved it.
#pragma once
#include <ATen/core/ivalue.h>

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

}  // namespace ptrain
