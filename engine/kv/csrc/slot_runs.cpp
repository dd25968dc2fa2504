// Tier 0's allocator core, natively: the free slots of the page_size=1 KV pool as merged runs
// [start, end), plus the pool's allocated-slot map, with every operation the decode loop makes
// per step (a batch of in-place growths with fall-backs, a batch of frees) in one call.
//
// Same semantics as kdtree.engine.free_runs.FreeRuns + SortedRunAllocator's Python core (the
// reference; tests hold the two to identical answers). A run is found from either end in O(1):
// end_of_[start] and start_of_[end - 1] (16 bytes per slot), so a free merges with its
// neighbours without a tree search; per power-of-two size class an ordered set of run starts
// answers "the lowest run of at least n slots": the lowest start of every class above n's and a
// short in-order scan of n's own class. A freed isolated hole costs one set insert.
// Errors are std::invalid_argument (ValueError in Python) with the Python core's wording; nothing
// changes before an error is raised.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;
using i64 = int64_t;

namespace {

int size_class(i64 length) { return 63 - __builtin_clzll(static_cast<unsigned long long>(length)); }

class SlotRuns {
 public:
  explicit SlotRuns(i64 num_slots) : num_slots_(num_slots) {
    if (num_slots < 1) throw std::invalid_argument("num_slots must be >= 1, got " + std::to_string(num_slots));
    in_use_.assign(static_cast<size_t>(num_slots), 0);
    end_of_.assign(static_cast<size_t>(num_slots), 0);
    start_of_.assign(static_cast<size_t>(num_slots), -1);
    insert_run(0, num_slots);
    num_free_ = num_slots;
  }

  // Rebuilt from the allocated map alone (a pickled or deep-copied allocator): every run of free slots.
  SlotRuns(i64 num_slots, const std::string& in_use) : SlotRuns(num_slots) {
    if (static_cast<i64>(in_use.size()) != num_slots)
      throw std::invalid_argument("SlotRuns state: the allocated map has " + std::to_string(in_use.size()) +
                                  " bytes for " + std::to_string(num_slots) + " slots");
    erase_run(0, num_slots);
    num_free_ = 0;
    for (i64 s = 0; s < num_slots;) {
      in_use_[s] = in_use[s] ? 1 : 0;
      if (in_use_[s]) {
        ++s;
        continue;
      }
      i64 e = s;
      while (e < num_slots && !in_use[e]) in_use_[e++] = 0;
      insert_run(s, e);
      num_free_ += e - s;
      s = e;
    }
  }

  std::string allocated_map() const { return std::string(in_use_.begin(), in_use_.end()); }

  i64 num_slots() const { return num_slots_; }
  i64 num_free() const { return num_free_; }
  i64 num_runs() const { return num_runs_; }

  bool is_allocated(i64 slot) const { return 0 <= slot && slot < num_slots_ && in_use_[slot]; }
  bool contains(i64 slot) const { return 0 <= slot && slot < num_slots_ && !in_use_[slot]; }

  i64 count_allocated(i64 start, i64 stop) const {
    start = std::max<i64>(0, start);
    stop = std::min(stop, num_slots_);
    i64 n = 0;
    for (i64 s = start; s < stop; ++s) n += in_use_[s];
    return n;
  }

  i64 highest_allocated() const {  // -1 when nothing is allocated
    for (i64 s = num_slots_ - 1; s >= 0; --s)
      if (in_use_[s]) return s;
    return -1;
  }

  i64 run_at(i64 start) const { return (0 <= start && start < num_slots_ && end_of_[start]) ? end_of_[start] - start : 0; }

  std::vector<std::pair<i64, i64>> runs() const {  // ascending by start
    std::vector<std::pair<i64, i64>> out;
    out.reserve(static_cast<size_t>(num_runs_));
    for (const auto& c : classes_)
      for (i64 s : c) out.emplace_back(s, end_of_[s] - s);
    std::sort(out.begin(), out.end());
    return out;
  }

  std::pair<i64, i64> largest_run() const {  // (start, length), the lowest among equals; (-1, 0) if none
    for (int c = 63; c >= 0; --c) {
      if (classes_[c].empty()) continue;
      std::pair<i64, i64> best{-1, 0};
      for (i64 s : classes_[c]) {
        const i64 len = end_of_[s] - s;
        if (len > best.second) best = {s, len};  // starts ascend: the first of equals is kept
      }
      return best;
    }
    return {-1, 0};
  }

  std::optional<i64> first_fit(i64 n) const {
    if (n < 1) throw std::invalid_argument("first_fit: n must be >= 1, got " + std::to_string(n));
    const int c = size_class(n);
    std::optional<i64> best;
    for (int k = c + 1; k < 64; ++k)
      if (!classes_[k].empty() && (!best || *classes_[k].begin() < *best)) best = *classes_[k].begin();
    for (i64 s : classes_[c]) {
      if (best && s >= *best) break;
      if (end_of_[s] - s >= n) return s;
    }
    return best;
  }

  i64 take_head(i64 start, i64 n) {  // marks what it takes allocated; returns how many
    if (start < 0 || start >= num_slots_ || !end_of_[start] || n <= 0) return 0;
    const i64 end = end_of_[start];
    const i64 k = std::min(n, end - start);
    erase_run(start, end);
    if (start + k < end) insert_run(start + k, end);
    std::memset(in_use_.data() + start, 1, static_cast<size_t>(k));
    num_free_ -= k;
    return k;
  }

  std::vector<i64> alloc(i64 n) {
    check_count(n, "alloc");
    std::vector<i64> out;
    out.reserve(static_cast<size_t>(n));
    fill(out, n);
    return out;
  }

  std::vector<std::vector<i64>> alloc_after_batch(const std::vector<i64>& lasts, const std::vector<i64>& sizes) {
    if (lasts.size() != sizes.size())
      throw std::invalid_argument("alloc_after_batch: " + std::to_string(lasts.size()) + " last slots but " +
                                  std::to_string(sizes.size()) + " sizes");
    i64 total = 0;
    for (i64 n : sizes) {
      if (n < 0) throw std::invalid_argument("alloc_after_batch: sizes must be >= 0");
      total += n;
    }
    check_count(total, "alloc_after_batch");
    std::vector<std::vector<i64>> outs(lasts.size());
    std::vector<std::pair<size_t, i64>> short_of;
    for (size_t b = 0; b < lasts.size(); ++b) {  // every request grows in place first ...
      const i64 last = lasts[b], n = sizes[b];
      outs[b].reserve(static_cast<size_t>(n));
      const i64 got = (last >= 0 && n) ? take_head(last + 1, n) : 0;
      for (i64 s = last + 1; s < last + 1 + got; ++s) outs[b].push_back(s);
      if (got < n) short_of.emplace_back(b, n - got);
    }
    for (const auto& [b, n] : short_of) fill(outs[b], n);  // ... then the ones still short fall back
    return outs;
  }

  void free(std::vector<i64> slots) {
    if (slots.empty()) return;
    std::sort(slots.begin(), slots.end());
    if (slots.front() < 0 || slots.back() >= num_slots_) {
      const i64 bad = slots.front() < 0 ? slots.front() : slots.back();
      throw std::invalid_argument("free: slot " + std::to_string(bad) + " is not in this pool (0.." +
                                  std::to_string(num_slots_ - 1) + ")");
    }
    for (size_t i = 0; i < slots.size(); ++i) {
      if (i && slots[i] == slots[i - 1])
        throw std::invalid_argument("free: slot ids repeat in one call: slot " + std::to_string(slots[i]));
      if (!in_use_[slots[i]])
        throw std::invalid_argument("free: slot " + std::to_string(slots[i]) + " is not allocated (double free?)");
    }
    for (const auto& [start, length] : runs_of_sorted(slots)) add_run(start, length);
  }

  void claim(std::vector<i64> slots) {
    std::sort(slots.begin(), slots.end());
    for (size_t i = 0; i < slots.size(); ++i) {
      const i64 s = slots[i];
      if (i && s == slots[i - 1])
        throw std::invalid_argument("claim: slot ids repeat in one call: slot " + std::to_string(s));
      if (s < 0 || s >= num_slots_)
        throw std::invalid_argument("claim: slot " + std::to_string(s) + " is not in this pool (0.." +
                                    std::to_string(num_slots_ - 1) + ")");
      if (in_use_[s]) throw std::invalid_argument("claim: slot " + std::to_string(s) + " is already allocated");
    }
    for (const auto& [start, length] : runs_of_sorted(slots)) remove_range(start, length);
  }

 private:
  static std::vector<std::pair<i64, i64>> runs_of_sorted(const std::vector<i64>& sorted) {
    std::vector<std::pair<i64, i64>> out;
    for (size_t i = 0; i < sorted.size();) {
      size_t j = i + 1;
      while (j < sorted.size() && sorted[j] == sorted[j - 1] + 1) ++j;
      out.emplace_back(sorted[i], static_cast<i64>(j - i));
      i = j;
    }
    return out;
  }

  void check_count(i64 n, const char* verb) const {
    if (n < 0) throw std::invalid_argument(std::string(verb) + ": n must be >= 0, got " + std::to_string(n));
    if (n > num_free_)  // the Python wrapper raises PoolExhaustedError before calling; this is a backstop
      throw std::invalid_argument(std::string(verb) + ": asked for " + std::to_string(n) + " slots, " +
                                  std::to_string(num_free_) + " are free");
  }

  void fill(std::vector<i64>& out, i64 n) {
    while (n > 0) {
      std::optional<i64> start = first_fit(n);
      i64 length = n;
      if (!start) {  // no run is long enough: the largest one, whole
        const auto lr = largest_run();
        start = lr.first;
        length = lr.second;
      }
      take_head(*start, length);
      for (i64 s = *start; s < *start + length; ++s) out.push_back(s);
      n -= length;
    }
  }

  void insert_run(i64 start, i64 end) {
    end_of_[start] = end;
    start_of_[end - 1] = start;
    classes_[size_class(end - start)].insert(start);
    ++num_runs_;
  }

  void erase_run(i64 start, i64 end) {
    classes_[size_class(end - start)].erase(start);
    end_of_[start] = 0;
    start_of_[end - 1] = -1;
    --num_runs_;
  }

  void add_run(i64 start, i64 length) {  // [start, start + length) is allocated (checked by the caller)
    i64 new_start = start, new_end = start + length;
    if (start > 0 && start_of_[start - 1] >= 0) {  // a free run ends right before
      new_start = start_of_[start - 1];
      erase_run(new_start, start);
    }
    if (start + length < num_slots_ && end_of_[start + length]) {  // a free run starts right after
      new_end = end_of_[start + length];
      erase_run(start + length, new_end);
    }
    insert_run(new_start, new_end);
    std::memset(in_use_.data() + start, 0, static_cast<size_t>(length));
    num_free_ += length;
  }

  void remove_range(i64 start, i64 length) {  // [start, start + length) is free (checked by the caller)
    // the run holding `start` begins after the last allocated slot before it
    const void* used = start ? memrchr(in_use_.data(), 1, static_cast<size_t>(start)) : nullptr;
    const i64 rs = used ? static_cast<const uint8_t*>(used) - in_use_.data() + 1 : 0;
    const i64 re = end_of_[rs], end = start + length;
    erase_run(rs, re);
    if (rs < start) insert_run(rs, start);
    if (end < re) insert_run(end, re);
    std::memset(in_use_.data() + start, 1, static_cast<size_t>(length));
    num_free_ -= length;
  }

  i64 num_slots_;
  i64 num_free_ = 0;
  i64 num_runs_ = 0;
  std::vector<uint8_t> in_use_;
  std::vector<i64> end_of_;    // a free run's start -> its end (exclusive); 0 elsewhere
  std::vector<i64> start_of_;  // a free run's last slot -> its start; -1 elsewhere
  std::set<i64> classes_[64];  // size class -> starts of its runs
};

}  // namespace

PYBIND11_MODULE(_slot_runs, m) {
  m.doc() = "Tier 0's allocator core (free slot runs + the allocated map), natively";
  py::class_<SlotRuns>(m, "SlotRuns")
      .def(py::init<i64>(), py::arg("num_slots"))
      .def_property_readonly("num_slots", &SlotRuns::num_slots)
      .def_property_readonly("num_free", &SlotRuns::num_free)
      .def("__len__", &SlotRuns::num_runs)
      .def("is_allocated", &SlotRuns::is_allocated)
      .def("contains", &SlotRuns::contains)
      .def("count_allocated", &SlotRuns::count_allocated)
      .def("highest_allocated", &SlotRuns::highest_allocated)
      .def("run_at", &SlotRuns::run_at)
      .def("runs", &SlotRuns::runs)
      .def("largest_run", &SlotRuns::largest_run)
      .def("largest", [](const SlotRuns& r) { return r.largest_run().second; })
      .def("first_fit", &SlotRuns::first_fit)
      .def("take_head", &SlotRuns::take_head)
      .def("alloc", &SlotRuns::alloc)
      .def("alloc_after_batch", &SlotRuns::alloc_after_batch)
      .def("free", &SlotRuns::free)
      .def("claim", &SlotRuns::claim)
      .def(py::init<i64, const std::string&>(), py::arg("num_slots"), py::arg("allocated_map"))
      .def("allocated_map", [](const SlotRuns& r) { return py::bytes(r.allocated_map()); });
}
