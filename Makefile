# The README's two commands: `make run` and `make test`. Each installs what is missing,
# builds, and then runs. Other targets are steps of those two.
PY        := /usr/bin/python3
BUILD     := build
KVLLM     := $(BUILD)/kvllm
# The bundled model: a 4.9M-parameter Llama trained on Jane Austen's novels (models/README.md).
MODEL     := models/kvllm-prose.gguf
JOBS      ?= $(shell nproc)

.PHONY: deps build run test test-asan bench bench-perf clean

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

# The tables of docs/benchmarks.md (several minutes: writes a 1.1 GB TinyLlama-shaped model).
bench: build
	BUILD=$(BUILD) bash bench/core_benchmarks.sh

# The roofline tables of docs/performance.md (about 20 minutes: writes three 0.6-2.2 GB
# TinyLlama-shaped models; prefills 4096 tokens twice). Re-run after a kernel change.
bench-perf: build
	BUILD=$(BUILD) bash bench/performance.sh --update-doc

clean:
	rm -rf $(BUILD) $(BUILD)-asan
