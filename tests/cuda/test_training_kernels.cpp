// Placeholder until the tests land (issue 14).
#include <doctest/doctest.h>
