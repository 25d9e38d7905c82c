// Dynamic batching (serve/batcher.h) with a stand-in forward pass: how batches form, which requests share one,
// what each request gets back, and how failures and the finish are answered.
#include "serve/batcher.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

using convnets::serve::Batcher;
using convnets::serve::BatchingOptions;
using convnets::serve::Outcome;
using convnets::serve::batching_for_graphs;
using convnets::serve::serving_graph_sizes;

namespace {

// A "network" whose logits are each row's first element and the batch's size, so a request can tell which rows
// it got back and how large the pass was.
struct Recorder {
  std::mutex m;
  std::vector<std::int64_t> passes;  // rows per call
  at::Tensor operator()(const at::Tensor& rows) {
    {
      std::lock_guard<std::mutex> lock(m);
      passes.push_back(rows.size(0));
    }
    const auto first = rows.reshape({rows.size(0), -1}).select(1, 0).to(at::kFloat);
    return at::stack({first, at::full({rows.size(0)}, static_cast<float>(rows.size(0)))}, 1);
  }
};

at::Tensor rows_of(float first, std::int64_t n, at::ScalarType type = at::kFloat) {
  return at::full({n, 3, 2, 2}, first).to(type);
}

BatchingOptions delayed(std::int64_t max_batch, std::int64_t delay_us) {
  BatchingOptions o;
  o.max_batch_size = max_batch;
  o.max_queue_delay_us = delay_us;
  return o;
}

}  // namespace

TEST(Batcher, RequestsWaitingTogetherShareOnePassAndGetTheirOwnRows) {
  Recorder rec;
  Batcher b(delayed(8, 5'000'000), [&](const at::Tensor& r) { return rec(r); });
  const auto start = std::chrono::steady_clock::now();
  auto f1 = b.submit(rows_of(1, 3));
  auto f2 = b.submit(rows_of(2, 2));
  auto f3 = b.submit(rows_of(3, 3));  // 8 rows: the batch is full and leaves without the 5 s delay
  const auto o1 = f1.get(), o2 = f2.get(), o3 = f3.get();
  // Well under the delay, with room for a loaded CI machine: a batcher that waited it out would take 5 s.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  ASSERT_EQ(o1.status, 200) << o1.error;
  EXPECT_EQ(rec.passes, std::vector<std::int64_t>{8});
  EXPECT_EQ(o1.logits.size(0), 3);
  EXPECT_EQ(o2.logits.size(0), 2);
  EXPECT_EQ(o3.logits.size(0), 3);
  EXPECT_TRUE(at::equal(o1.logits.select(1, 0), at::full({3}, 1.0f)));
  EXPECT_TRUE(at::equal(o2.logits.select(1, 0), at::full({2}, 2.0f)));
  EXPECT_TRUE(at::equal(o3.logits.select(1, 0), at::full({3}, 3.0f)));
  EXPECT_EQ(o2.batch_rows, 8);
  const auto s = b.stats();
  EXPECT_EQ(s.executions, 1);
  EXPECT_EQ(s.inferences, 8);
  EXPECT_EQ(s.batch_sizes.at(8), 1);
}

TEST(Batcher, APreferredSizeLeavesAtOnceAndTheDelayEndsASmallerOne) {
  Recorder rec;
  auto o = delayed(8, 1'500'000);
  o.preferred_batch_sizes = {2};
  Batcher b(o, [&](const at::Tensor& r) { return rec(r); });
  using std::chrono::steady_clock;
  const auto start = steady_clock::now();
  auto f1 = b.submit(rows_of(1, 1));
  auto f2 = b.submit(rows_of(2, 1));  // 2 rows: preferred, they leave together at once
  const auto o1 = f1.get(), o2 = f2.get();
  // Before the 1.5 s delay (by a margin a loaded CI machine keeps), and as one pass of the preferred size.
  EXPECT_LT(steady_clock::now() - start, std::chrono::milliseconds(750));
  EXPECT_EQ(o1.status, 200);
  EXPECT_EQ(o2.status, 200);
  EXPECT_EQ(o1.batch_rows, 2);
  const auto alone = steady_clock::now();
  auto f3 = b.submit(rows_of(3, 1));  // alone: waits out the delay, then runs as a batch of 1
  EXPECT_EQ(f3.get().batch_rows, 1);
  EXPECT_GE(steady_clock::now() - alone, std::chrono::milliseconds(1490));
  EXPECT_EQ(rec.passes, (std::vector<std::int64_t>{2, 1}));
}

// With the requests announced from their arrival (serve's way), a queue that holds every request on its way leaves
// at once: a lone request does not wait out the delay for work that is not coming; one that is coming is waited
// for, and joins; one that fails before it is queued stops the wait.
TEST(Batcher, AQueueHoldingEveryAnnouncedRequestLeavesAtOnce) {
  Recorder rec;
  auto o = delayed(8, 3'000'000);
  o.known_arrivals = true;
  Batcher b(o, [&](const at::Tensor& r) { return rec(r); });
  using std::chrono::steady_clock;
  const auto start = steady_clock::now();
  {
    auto token = b.announce();
    auto f = b.submit(rows_of(1, 1));
    EXPECT_EQ(f.get().batch_rows, 1);
  }
  EXPECT_LT(steady_clock::now() - start, std::chrono::milliseconds(1500)) << "the lone request waited out the delay";
  // A second request on its way: the first waits for it, and both share one pass.
  auto ta = b.announce(), tb = b.announce();
  auto fa = b.submit(rows_of(2, 1));
  EXPECT_EQ(fa.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  auto fb = b.submit(rows_of(3, 1));
  EXPECT_EQ(fa.get().batch_rows, 2);
  EXPECT_EQ(fb.get().batch_rows, 2);
  ta.reset(), tb.reset();
  // One that never comes (its parse failed): released, the waiting request leaves.
  ta = b.announce(), tb = b.announce();
  auto fc = b.submit(rows_of(4, 1));
  EXPECT_EQ(fc.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  const auto released = steady_clock::now();
  tb.reset();
  EXPECT_EQ(fc.get().batch_rows, 1);
  EXPECT_LT(steady_clock::now() - released, std::chrono::milliseconds(1500));
  EXPECT_EQ(rec.passes, (std::vector<std::int64_t>{1, 2, 1}));
}

TEST(Batcher, TheLargestPreferredSizeTheQueueFillsLeavesAtOnce) {
  Recorder rec;
  std::atomic<bool> release{false};
  auto o = delayed(8, 5'000'000);
  o.preferred_batch_sizes = {2, 4};
  // The first pass blocks until five requests wait behind it; then 4 of them (preferred) leave without the 5 s wait.
  bool first = true;
  Batcher b(o, [&](const at::Tensor& r) {
    if (first) {
      first = false;
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return rec(r);
  });
  std::vector<std::future<Outcome>> f;
  f.push_back(b.submit(rows_of(0, 1)));
  f.push_back(b.submit(rows_of(0, 1)));  // with the first: 2 rows, preferred, so both go
  while (b.stats().pending > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (int i = 0; i < 5; ++i) f.push_back(b.submit(rows_of(static_cast<float>(i + 1), 1)));
  const auto start = std::chrono::steady_clock::now();
  release = true;
  for (int i = 0; i < 6; ++i) EXPECT_EQ(f[static_cast<std::size_t>(i)].get().status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  b.finish();  // the fifth waits for company no longer
  EXPECT_EQ(f[6].get().status, 200);
  EXPECT_EQ(rec.passes, (std::vector<std::int64_t>{2, 4, 1}));
}

TEST(Batcher, RowsOfDifferentKindsNeverShareAPass) {
  Recorder rec;
  Batcher b(delayed(8, 200'000), [&](const at::Tensor& r) { return rec(r); });
  auto pixels = b.submit(rows_of(7, 2, at::kByte));
  auto floats = b.submit(rows_of(1, 2));
  auto small = b.submit(at::zeros({1, 3, 1, 1}));
  EXPECT_EQ(pixels.get().status, 200);
  EXPECT_EQ(floats.get().status, 200);
  EXPECT_EQ(small.get().status, 200);
  EXPECT_EQ(rec.passes, (std::vector<std::int64_t>{2, 2, 1}));
}

TEST(Batcher, AFullQueueAndAnOversizedRequestAreAnsweredAtOnce) {
  std::atomic<bool> release{false};
  auto o = delayed(4, 0);
  o.max_queue_size = 1;
  Batcher b(o, [&](const at::Tensor& r) {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return at::zeros({r.size(0), 2});
  });
  auto running = b.submit(rows_of(1, 1));
  while (b.stats().pending > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // taken by the instance
  auto queued = b.submit(rows_of(2, 1));
  auto refused = b.submit(rows_of(3, 1));
  ASSERT_EQ(refused.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  const auto r = refused.get();
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.error.find("Exceeds maximum queue size"), std::string::npos) << r.error;
  const auto big = b.submit(rows_of(4, 5)).get();
  EXPECT_EQ(big.status, 400);
  EXPECT_NE(big.error.find("max_batch_size of 4"), std::string::npos) << big.error;
  release = true;
  EXPECT_EQ(running.get().status, 200);
  EXPECT_EQ(queued.get().status, 200);
  EXPECT_EQ(b.stats().refused_full, 1);
}

TEST(Batcher, ATimedOutRequestIsAnsweredAndNotRun) {
  Recorder rec;
  Batcher b(delayed(8, 300'000), [&](const at::Tensor& r) { return rec(r); });
  auto late = b.submit(rows_of(1, 1), 1000);  // 1 ms, inside the 0.3 s batching delay
  auto fine = b.submit(rows_of(2, 1));
  const auto o = late.get();
  EXPECT_EQ(o.status, 503);
  EXPECT_NE(o.error.find("Request timeout expired"), std::string::npos) << o.error;
  EXPECT_EQ(fine.get().batch_rows, 1);
  EXPECT_EQ(rec.passes, std::vector<std::int64_t>{1});
  EXPECT_EQ(b.stats().timed_out, 1);
}

TEST(Batcher, AFailedPassFailsEachOfItsRequestsAndTheNextPassRuns) {
  std::atomic<int> calls{0};
  Batcher b(delayed(4, 100'000), [&](const at::Tensor& r) -> at::Tensor {
    if (calls++ == 0) throw std::runtime_error("engine exploded");
    if (calls == 2) return at::zeros({r.size(0) + 1, 2});  // one row too many
    return at::zeros({r.size(0), 2});
  });
  auto a = b.submit(rows_of(1, 2));
  auto c = b.submit(rows_of(2, 2));
  const auto oa = a.get(), oc = c.get();
  EXPECT_EQ(oa.status, 500);
  EXPECT_EQ(oc.status, 500);
  EXPECT_EQ(oa.error, "engine exploded");
  const auto wrong = b.submit(rows_of(3, 1)).get();
  EXPECT_EQ(wrong.status, 500);
  EXPECT_NE(wrong.error.find("2 rows of logits for a batch of 1"), std::string::npos) << wrong.error;
  EXPECT_EQ(b.submit(rows_of(4, 1)).get().status, 200);
  EXPECT_EQ(b.stats().failed, 3);
}

TEST(Batcher, FinishRunsWhatIsQueuedAndRefusesWhatComesAfter) {
  Recorder rec;
  auto o = delayed(8, 10'000'000);  // would wait 10 s for company
  o.instances = 2;
  Batcher b(o, [&](const at::Tensor& r) { return rec(r); });
  auto queued = b.submit(rows_of(1, 1));
  const auto start = std::chrono::steady_clock::now();
  b.finish();  // does not wait out the delay
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(queued.get().status, 200);
  const auto after = b.submit(rows_of(2, 1)).get();
  EXPECT_EQ(after.status, 503);
  EXPECT_NE(after.error.find("shutting down"), std::string::npos);
}

// On CUDA graphs: the sizes captured where none are declared, and the preferred sizes that fill them.
TEST(Batcher, GraphSizesDoubleUpToTheLargestBatchAndAreItsPreferredSizes) {
  using V = std::vector<std::int64_t>;
  EXPECT_EQ(serving_graph_sizes(1), V({1}));
  EXPECT_EQ(serving_graph_sizes(8), V({1, 2, 4, 8}));
  EXPECT_EQ(serving_graph_sizes(24), V({1, 2, 4, 8, 16, 24}));
  BatchingOptions o;
  o.max_batch_size = 16;
  EXPECT_EQ(batching_for_graphs(o, {1, 2, 4, 8, 16}).preferred_batch_sizes, V({16}))
      << "the largest: 7 rows queued go as one pass, padded to 8, not as 4, 2 and 1";
  EXPECT_EQ(batching_for_graphs(o, {1, 8, 32}).preferred_batch_sizes, V({8})) << "within --max-batch-size";
  EXPECT_EQ(batching_for_graphs(o, {1}).preferred_batch_sizes, V()) << "1 would never wait for others";
  EXPECT_NO_THROW(batching_for_graphs(o, {1, 8, 32}).validate());
  o.preferred_batch_sizes = {4};
  EXPECT_EQ(batching_for_graphs(o, {1, 2, 4, 8, 16}).preferred_batch_sizes, V({4})) << "the user's own, kept";
}

TEST(Batcher, SettingsAreCheckedByFlag) {
  auto bad = [](auto edit) {
    BatchingOptions o;
    edit(o);
    try {
      o.validate();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(bad([](BatchingOptions& o) { o.max_batch_size = 0; }).find("--max-batch-size"), std::string::npos);
  EXPECT_NE(bad([](BatchingOptions& o) { o.preferred_batch_sizes = {9}; }).find("--preferred-batch-sizes: 9"),
            std::string::npos);
  EXPECT_NE(bad([](BatchingOptions& o) { o.instances = 0; }).find("--instances"), std::string::npos);
  EXPECT_NE(bad([](BatchingOptions& o) { o.max_queue_size = 0; }).find("--max-queue-size"), std::string::npos);
  EXPECT_NE(bad([](BatchingOptions& o) { o.max_queue_delay_us = -1; }).find("--max-queue-delay-us"), std::string::npos);
}
