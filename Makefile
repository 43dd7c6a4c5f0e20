# The README's two commands: `make run` and `make test`. Each installs what is missing,
# builds, and then runs. Other targets are steps of those two.
PY        := /usr/bin/python3
BUILD     := build
KVLLM     := $(BUILD)/kvllm
# Until the bundled trained model lands, `make run` uses a random-weight model of llama2.c's
# stories15M shape written by tools/make_model.py: the text it prints is noise.
DEMO_MODEL := $(BUILD)/models/stories15m-random-q8_0.gguf
JOBS      ?= $(shell nproc)

.PHONY: deps build run test test-asan bench clean

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

$(DEMO_MODEL): tools/make_model.py tools/gguf.py
	@mkdir -p $(dir $@)
	@$(PY) tools/make_model.py --preset stories15m --type q8_0 --seed 1 --out $@

run: build $(DEMO_MODEL)
	$(KVLLM) run -m $(DEMO_MODEL) -p "Once upon a time" -n 64 --seed 42

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

clean:
	rm -rf $(BUILD) $(BUILD)-asan
