// Test helpers for bad-input errors, shared by every suite:
// error_message(f) is the message of the kiln::Error f throws (a marker when it
// throws something else or nothing); EXPECT_KILN_ERROR(stmt, "op", "part", ...)
// checks that stmt throws kiln::Error whose message starts with "[op] " and
// names every part (shapes, dtypes, values).
#pragma once
#include <gtest/gtest.h>

#include <exception>
#include <initializer_list>
#include <string>

#include "kiln/error.h"

namespace kiln_test {

// The kiln::Error message thrown by f, or a marker saying what happened instead.
template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const kiln::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a kiln::Error: ") + e.what() + ">";
  }
  return "<no exception>";
}

// msg starts with "[op] " and contains every one of `parts`.
inline ::testing::AssertionResult is_error(const std::string& msg, const std::string& op,
                                           std::initializer_list<const char*> parts) {
  const std::string prefix = "[" + op + "] ";
  if (msg.rfind(prefix, 0) != 0)
    return ::testing::AssertionFailure()
           << "message does not start with \"" << prefix << "\": " << msg;
  for (const char* p : parts)
    if (msg.find(p) == std::string::npos)
      return ::testing::AssertionFailure() << "message does not mention \"" << p << "\": " << msg;
  return ::testing::AssertionSuccess() << msg;
}

}  // namespace kiln_test

#define EXPECT_KILN_ERROR(stmt, op, ...) \
  EXPECT_TRUE(                           \
      ::kiln_test::is_error(::kiln_test::error_message([&] { (void)(stmt); }), op, {__VA_ARGS__}))
