// Every failure path of the local backend ends in an error that says what
// happened, never a hang: timeouts name the collective, its sequence number and
// exactly the missing ranks; a dead rank fails everyone's pending and later
// collectives fast and run_local rethrows the root cause; mismatched
// collectives are reported with both signatures (always for sizes, kinds,
// dtypes and ops; for shapes in debug mode); misuse throws before blocking.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dist/backends/local_backend.h"
#include "dist/errors.h"
#include "tensor/ops.h"

using namespace tessera;
using namespace tessera::dist;
namespace ops = tessera::ops;
using namespace std::chrono_literals;

namespace {

LocalOptions with_timeout(std::chrono::milliseconds timeout) {
  LocalOptions options;
  options.group.timeout = timeout;
  return options;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("local failures: a skipped collective times out naming it, its number and exactly the missing ranks") {
  for (const std::vector<int>& skipping : {std::vector<int>{2}, std::vector<int>{1, 3}}) {
    std::vector<std::string> messages(4);
    run_local(
        4,
        [&](const ProcessGroupPtr& world) {
          const int r = world->rank();
          world->barrier();  // #0: everyone is there
          if (std::find(skipping.begin(), skipping.end(), r) != skipping.end()) return;
          Tensor out = ops::zeros({16});
          try {
            world->all_gather_into(out, ops::ones({4}));
          } catch (const CollectiveTimeout& e) {
            messages[r] = e.what();
          }
        },
        with_timeout(300ms));
    const std::string expected = fmt::format(
        "#1 all_gather_into(f32, in [4], out [16]) on group 'world' timed out after 0.3 s: ranks {} never arrived",
        skipping);
    for (int r = 0; r < 4; ++r) {
      const bool skipped = std::find(skipping.begin(), skipping.end(), r) != skipping.end();
      CHECK(messages[r] == (skipped ? "" : expected));
    }
  }
}

TEST_CASE("local failures: a sub-group timeout names group and world ranks; run_local rethrows it") {
  CHECK_THROWS_WITH_AS(
      run_local(
          4,
          [&](const ProcessGroupPtr& world) {
            const int r = world->rank();
            const ProcessGroupPtr half = world->split(r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3},
                                                      r < 2 ? "lower" : "upper");
            if (r == 3) return;  // never joins the upper half's all-reduce
            Tensor data = ops::ones({2});
            if (r == 2) half->all_reduce(data);
          },
          with_timeout(300ms)),
      "#0 all_reduce(f32, sum, [2]) on group 'upper' timed out after 0.3 s: ranks [1] (world ranks [3]) never arrived",
      CollectiveTimeout);
}

TEST_CASE("local failures: a rank arriving after its peers gave up is told so") {
  std::vector<std::string> messages(3);
  run_local(
      3,
      [&](const ProcessGroupPtr& world) {
        const int r = world->rank();
        if (r == 2) std::this_thread::sleep_for(700ms);  // well past the others' timeout
        try {
          world->barrier();
        } catch (const CollectiveTimeout& e) {
          messages[r] = e.what();
        }
      },
      with_timeout(200ms));
  const std::string timed_out = "#0 barrier() on group 'world' timed out after 0.2 s: ranks [2] never arrived";
  CHECK(messages[0] == timed_out);
  CHECK(messages[1] == timed_out);
  CHECK(messages[2] == "#0 barrier() on group 'world': arrived after a peer gave up waiting (" + timed_out + ")");
}

TEST_CASE("local failures: a dead rank fails pending and later collectives fast; run_local rethrows the root cause") {
  std::vector<std::string> pending(4), later(4);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(run_local(
                           4,
                           [&](const ProcessGroupPtr& world) {
                             const int r = world->rank();
                             Tensor data = ops::ones({4});
                             world->all_reduce(data);  // #0 succeeds everywhere
                             if (r == 2) {
                               std::this_thread::sleep_for(50ms);  // the others are waiting in #1 by now
                               throw std::runtime_error("boom");
                             }
                             Tensor out = ops::zeros({16});
                             try {
                               world->all_gather_into(out, data);
                             } catch (const RankFailed& e) {
                               pending[r] = e.what();
                             }
                             try {
                               world->barrier();
                             } catch (const RankFailed& e) {
                               later[r] = e.what();
                             }
                             world->barrier();  // escapes: an echo, not the root cause
                           },
                           with_timeout(60s)),
                       "boom", std::runtime_error);
  CHECK(seconds_since(start) < 10.0);  // nobody waited for the 60 s timeout
  for (int r : {0, 1, 3}) {
    CHECK(pending[r] == "#1 all_gather_into(f32, in [4], out [16]) on group 'world': rank 2 failed: boom");
    CHECK(later[r] == "#2 barrier() on group 'world': rank 2 failed: boom");
  }
  CHECK(pending[2].empty());
}

TEST_CASE("local failures: a dead rank wakes peers waiting in sub-groups; the root cause keeps its type") {
  std::string message;
  const auto start = std::chrono::steady_clock::now();
  try {
    run_local(
        4,
        [&](const ProcessGroupPtr& world) {
          const int r = world->rank();
          const ProcessGroupPtr half =
              world->split(r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}, r < 2 ? "lower" : "upper");
          if (r == 3) fail("rank {} gave up", r);
          if (r == 2) {
            Tensor data = ops::ones({2});
            try {
              half->all_reduce(data);
            } catch (const RankFailed& e) {
              message = e.what();
            }
          }
          world->barrier();
        },
        with_timeout(60s));
    FAIL("run_local returned normally");
  } catch (const RankFailed& e) {
    FAIL("run_local rethrew an echo: ", e.what());
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "rank 3 gave up");
  }
  CHECK(seconds_since(start) < 10.0);
  CHECK(message == "#0 all_reduce(f32, sum, [2]) on group 'upper': rank 3 failed: rank 3 gave up");
}

TEST_CASE("local failures: mismatched collectives are reported with both signatures on every rank") {
  // Rank 1 issues something else than ranks 0 and 2.
  struct Mismatch {
    const char* what;
    std::function<void(const ProcessGroupPtr&)> rank1;
    const char* rank1_signature;
  };
  const auto all_reduce_of = [](Tensor data, ReduceOp op) {
    return [data, op](const ProcessGroupPtr& world) mutable { world->all_reduce(data, op); };
  };
  const std::vector<Mismatch> mismatches = {
      {"kind", [](const ProcessGroupPtr& world) { world->broadcast(ops::ones({4}), 0); },
       "#0 broadcast(f32, root 0, [4])"},
      {"size", all_reduce_of(ops::ones({5}), ReduceOp::sum), "#0 all_reduce(f32, sum, [5])"},
      {"dtype", all_reduce_of(ops::ones({4}, {.dtype = DType::f64}), ReduceOp::sum), "#0 all_reduce(f64, sum, [4])"},
      {"op", all_reduce_of(ops::ones({4}), ReduceOp::max), "#0 all_reduce(f32, max, [4])"},
  };
  for (bool debug : {false, true}) {
    for (const Mismatch& mismatch : mismatches) {
      CAPTURE(mismatch.what);
      CAPTURE(debug);
      LocalOptions options = with_timeout(2s);
      options.group.check_collectives = debug;
      std::vector<std::string> messages(3);
      run_local(
          3,
          [&](const ProcessGroupPtr& world) {
            const int r = world->rank();
            try {
              if (r == 1) {
                mismatch.rank1(world);
              } else {
                world->all_reduce(ops::ones({4}));
              }
            } catch (const CollectiveMismatch& e) {
              messages[r] = e.what();
            }
          },
          options);
      for (const std::string& message : messages) {
        CHECK(contains(message, "collective mismatch on group 'world'"));
        CHECK(contains(message, "rank 0 issued #0 all_reduce(f32, sum, [4])"));
        CHECK(contains(message, std::string("rank 1 issued ") + mismatch.rank1_signature));
      }
    }
  }
}

TEST_CASE("local failures: shapes of equal size pass the always-on check and fail in debug mode") {
  for (bool debug : {false, true}) {
    LocalOptions options = with_timeout(2s);
    options.group.check_collectives = debug;
    std::vector<std::string> messages(2);
    std::vector<std::vector<float>> results(2);
    run_local(
        2,
        [&](const ProcessGroupPtr& world) {
          const int r = world->rank();
          Tensor data = r == 0 ? ops::full({2, 2}, 1.0) : ops::full({4}, 2.0);
          try {
            world->all_reduce(data);
          } catch (const CollectiveMismatch& e) {
            messages[r] = e.what();
          }
          results[r] = data.to_vector<float>();
        },
        options);
    for (int r = 0; r < 2; ++r) {
      if (debug) {
        CHECK(messages[r] ==
              "collective mismatch on group 'world' (debug mode): rank 0 issued #0 all_reduce(f32, sum, [2, 2]) but "
              "rank 1 issued #0 all_reduce(f32, sum, [4]); every rank must issue the same collectives in the same "
              "order with the same shapes, dtypes and ops");
        CHECK(results[r] == std::vector<float>(4, r == 0 ? 1.0f : 2.0f));  // untouched
      } else {
        CHECK(messages[r].empty());
        CHECK(results[r] == std::vector<float>(4, 3.0f));  // the transport is flat
      }
    }
  }
}

TEST_CASE("local failures: misuse throws before anything is issued, and the group stays in step") {
  run_local(
      3,
      [&](const ProcessGroupPtr& world) {
        const int r = world->rank();
        // Every rank misuses the same way; each throws at once on its own thread.
        CHECK_THROWS_WITH_AS(world->all_gather_into(ops::zeros({10}), ops::ones({4})),
                             "all_gather_into: out must hold 3 ranks x 4 elements = 12, got 10 elements "
                             "(out [10], in [4])",
                             Error);
        CHECK_THROWS_WITH_AS(world->reduce_scatter_into(ops::zeros({4}), ops::ones({13})),
                             "reduce_scatter_into: in must hold 3 ranks x 4 elements = 12, got 13 elements "
                             "(in [13], out [4])",
                             Error);
        CHECK_THROWS_WITH_AS(world->all_gather_into(ops::zeros({12}, {.dtype = DType::f64}), ops::ones({4})),
                             "all_gather_into: out is f64 but in is f32", Error);
        CHECK_THROWS_WITH_AS(world->all_reduce(ops::transpose(ops::zeros({4, 3}), 0, 1)),
                             "all_reduce: tensor [3, 4] is not contiguous (strides [1, 3]); pass a contiguous buffer",
                             Error);
        CHECK_THROWS_WITH_AS(world->all_reduce(ops::zeros({4}, {.dtype = DType::boolean})),
                             "all_reduce: tensor has dtype bool; collectives carry f32, f64, bf16, f16, f8e4m3, f8e5m2, i32, i64 and u8",
                             Error);
        CHECK_THROWS_WITH_AS(world->broadcast(ops::ones({4}), 3),
                             "broadcast: root 3 is not a rank of group 'world' (size 3)", Error);
        CHECK_THROWS_WITH_AS(world->broadcast(ops::ones({4}), -1),
                             "broadcast: root -1 is not a rank of group 'world' (size 3)", Error);
        Tensor whole = ops::zeros({12});
        CHECK_THROWS_WITH_AS(world->all_gather_into(whole, ops::narrow(whole, 0, ((r + 1) % 3) * 4, 4)),
                             fmt::format("all_gather_into: in and out overlap, but the smaller buffer is not rank "
                                         "{}'s chunk of the larger one (the only in-place form allowed)",
                                         r)
                                 .c_str(),
                             Error);

        // Nothing was issued: the next collective is #0 and works.
        Tensor data = ops::ones({4});
        const Work work = world->all_reduce(data, ReduceOp::sum, /*async_op=*/true);
        work.wait();
        CHECK(work.description() == "all_reduce #0 on group 'world'");
        CHECK(data.to_vector<float>() == std::vector<float>(4, 3.0f));
      },
      with_timeout(2s));
}

TEST_CASE("local failures: misuse on one rank fails the others fast instead of hanging them") {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> messages(3);
  CHECK_THROWS_WITH_AS(run_local(
                           3,
                           [&](const ProcessGroupPtr& world) {
                             const int r = world->rank();
                             Tensor out = ops::zeros({r == 0 ? 10 : 12});
                             try {
                               world->all_gather_into(out, ops::ones({4}));
                             } catch (const RankFailed& e) {
                               messages[r] = e.what();
                             }
                           },
                           with_timeout(60s)),
                       "all_gather_into: out must hold 3 ranks x 4 elements = 12, got 10 elements (out [10], in [4])",
                       Error);
  CHECK(seconds_since(start) < 10.0);
  for (int r : {1, 2}) {
    CHECK(messages[r] ==
          "#0 all_gather_into(f32, in [4], out [12]) on group 'world': rank 0 failed: all_gather_into: out must hold "
          "3 ranks x 4 elements = 12, got 10 elements (out [10], in [4])");
  }
}
