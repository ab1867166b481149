# The pretrain pipeline: each step is a target with file dependencies, so a re-run redoes only what changed.
OUT ?= out/pretrain
SEED ?= 1234

.PHONY: pretrain
pretrain: setup
	@echo "pretrain: the pipeline is assembled step by step as the commands land; see README" >&2
