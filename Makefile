# The README's two commands: `make run` and `make test`. Each installs what is missing,
# builds, and then runs. Other targets are steps of those two.
PY        := /usr/bin/python3
BUILD     := build
KVLLM     := $(BUILD)/kvllm
# The bundled model: a 4.9M-parameter Llama trained on Jane Austen's novels (models/README.md).
MODEL     := models/kvllm-prose.gguf
JOBS      ?= $(shell nproc)

.PHONY: deps build run test test-asan test-tsan fuzz-build fuzz fuzz-ci soak bench bench-perf \
  clean

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

run: build
	$(KVLLM) run -m $(MODEL) -p "It is a truth universally acknowledged" -n 100 --seed 42

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# AddressSanitizer + UndefinedBehaviorSanitizer build of the whole suite.
test-asan: deps
	@cmake -S . -B $(BUILD)-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKVLLM_SANITIZE=ON \
	  -DKVLLM_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS)
	@cd $(BUILD)-asan && ctest --output-on-failure -j $(JOBS)

# libFuzzer targets of fuzz/ (clang 14, ASan + UBSan), each run on a scratch copy of its seed
# corpus for FUZZ_RUNS executions (FUZZ_SECONDS > 0 also caps its time); docs/reliability.md.
FUZZ_BUILD   := $(BUILD)-fuzz
FUZZ_RUNS    ?= 1000000
FUZZ_SECONDS ?= 0

fuzz-build: deps
	@CC=clang-14 CXX=clang++-14 cmake -S . -B $(FUZZ_BUILD) -G Ninja \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVLLM_FUZZ=ON >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS)

fuzz: fuzz-build
	@FUZZ_RUNS=$(FUZZ_RUNS) FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/run-fuzzers.sh $(FUZZ_BUILD)

# CI: every target briefly (about a minute in all); fails on any crash.
fuzz-ci:
	@$(MAKE) --no-print-directory fuzz FUZZ_RUNS=20000 FUZZ_SECONDS=0

# ThreadSanitizer build of the tests with real concurrency: the thread pool, attention shared
# across threads (AttentionSplit), batching, the server end to end (its kvllm children are
# TSan builds too), the store's background writer, persistence across servers, and a short
# soak. Reports from every process (the children included) go to
# $(BUILD)-tsan/tsan-reports/; any report fails the target.
# tests/tsan.supp lists the suppressed reports and why. ServerTest.FullQueue... is left out:
# its six 400-token generations run one at a time and, 5-10x slower under TSan, outlast the
# client's 120-s timeout on a busy machine; it has no concurrency the others lack.
TSAN_TARGETS := kvllm tensor_test kv_test batching_test server_test store_test persistence_test soak_test
TSAN_TESTS   := ^(ThreadPoolTest|AttentionSplitTest|BatchingTest|ServerTest|StoreTest|PersistenceTest|SoakTest)\.
test-tsan: deps
	@cmake -S . -B $(BUILD)-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVLLM_TSAN=ON \
	  -DKVLLM_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(BUILD)-tsan -j $(JOBS) --target $(TSAN_TARGETS)
	@rm -rf $(BUILD)-tsan/tsan-reports && mkdir -p $(BUILD)-tsan/tsan-reports
	@cd $(BUILD)-tsan && \
	  TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp log_path=$(CURDIR)/$(BUILD)-tsan/tsan-reports/tsan second_deadlock_stack=1" \
	  ctest --output-on-failure -j $(JOBS) -R '$(TSAN_TESTS)' -E FullQueue; rc=$$?; \
	if ls tsan-reports/tsan.* >/dev/null 2>&1; then \
	  cat tsan-reports/tsan.*; echo "test-tsan: ThreadSanitizer reports above"; exit 1; \
	fi; echo "test-tsan: no ThreadSanitizer report"; exit $$rc

# The soak test of docs/reliability.md: 10,000 mixed requests against one server.
SOAK_REQUESTS ?= 10000
soak: build
	KVLLM_SOAK_REQUESTS=$(SOAK_REQUESTS) $(BUILD)/tests/soak_test

# The tables of docs/benchmarks.md (several minutes: writes a 1.1 GB TinyLlama-shaped model).
bench: build
	BUILD=$(BUILD) bash bench/core_benchmarks.sh

# The roofline tables of docs/performance.md (about 20 minutes: writes three 0.6-2.2 GB
# TinyLlama-shaped models; 12 depth runs each prefill 4096 tokens). Re-run after a kernel change.
bench-perf: build
	BUILD=$(BUILD) bash bench/performance.sh --update-doc

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan $(FUZZ_BUILD)
