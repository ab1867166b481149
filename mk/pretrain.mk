# The pretrain pipeline: each step is a target with file dependencies, so a re-run redoes only what changed.
#
#   built-in corpus (or CORPUS=...) -> tokenizer -> llm-prep json2bin (one prefix per source)
#     -> llm-mix (WEIGHTS) -> llm-train (CONFIG, DS, NPROC processes) -> llm-ckpt verify / convert to HF
#     -> llm-log summary / plot -> llm-ckpt eval on a downstream task (the built-in corpus only)
#
#   make pretrain                                     # the embedded default, a few minutes on 2 CPU cores
#   make pretrain NPROC=2                             # two processes under torchrun
#   make pretrain CORPUS="a.jsonl b.jsonl.gz" WEIGHTS=0.7,0.3 VOCAB=8000 SEQ=256 SAMPLES=20000
#   make pretrain CONFIG=configs/train/tiny.yaml DS=configs/deepspeed/zero3.json TRAIN_ARGS="--set training.train_steps=100"
#   make pretrain RESUME=auto                         # continue an interrupted run instead of starting over
#
# Everything lands under $(OUT); the run folder is $(OUT)/run.
OUT ?= out/pretrain
SEED ?= 1234
CORPUS ?=
WEIGHTS ?= 0.7,0.3
VOCAB ?= 4096
SEQ ?= 128
SAMPLES ?= 3400
VALID_SAMPLES ?= 256
SAMPLE_DOCS ?= 2000
CONFIG ?= configs/train/tiny.yaml
DS ?= configs/deepspeed/zero2.json
NPROC ?= 1
RESUME ?=
TRAIN_ARGS ?=

BIN := $(VENV)/bin
RAW := $(OUT)/raw
DATA := $(OUT)/data
RUN := $(OUT)/run
TOKENIZER := $(OUT)/tokenizer.json
MIX := $(OUT)/mix.json
HF := $(OUT)/hf
# A downstream task built like the built-in corpus (arithmetic sums); user corpora have no such task.
TASK := $(OUT)/tasks/arith_sums.jsonl
EVAL := $(if $(strip $(CORPUS)),,$(OUT)/eval.json)

# Sources: the built-in sample corpus (two styles, so the mix has two sources) unless CORPUS names files.
DEFAULT_SOURCES := $(RAW)/stories.jsonl $(RAW)/arith.jsonl
SOURCES := $(if $(strip $(CORPUS)),$(CORPUS),$(DEFAULT_SOURCES))
stem = $(basename $(basename $(notdir $(1))))
PREFIXES := $(foreach s,$(SOURCES),$(DATA)/$(call stem,$(s))_text_document)

# One process: llm-train itself. Several: torchrun on a free port (concurrent runs never collide).
ifeq ($(NPROC),1)
LAUNCH = $(BIN)/llm-train
else
LAUNCH = $(BIN)/torchrun --nproc_per_node $(NPROC) \
	--master_port $$($(PY) -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])') \
	-m llmtools.cli.train
endif
TRAIN_MODE = $(if $(strip $(RESUME)),--resume $(RESUME),--force)
PIPELINE_SETS = --set data.mix=$(MIX) --set data.seq_length=$(SEQ) --set model.vocab_size=$(VOCAB)

.PHONY: pretrain pretrain-data pretrain-train pretrain-clean

pretrain: $(OUT)/summary.txt $(OUT)/curves.png $(OUT)/verify.txt $(HF)/config.json $(EVAL)
	@echo ""
	@echo "pretrain: done. Everything is under $(OUT)/:"
	@echo "  corpus       $(SOURCES)"
	@echo "  tokenizer    $(TOKENIZER)"
	@echo "  tokenized    $(PREFIXES)  (.bin/.idx/.json each)"
	@echo "  mix          $(MIX)  (weights $(WEIGHTS), seq $(SEQ), $(SAMPLES) samples)"
	@echo "  run          $(RUN)/  (config.yaml, ds_config.json, metrics.jsonl, checkpoints/)"
	@echo "  checkpoint   $(RUN)/checkpoints/$$(cat $(RUN)/checkpoints/latest 2>/dev/null)  (verified: $(OUT)/verify.txt)"
	@echo "  HF model     $(HF)/"
	@echo "  curves       $(OUT)/curves.png"
	@echo "  summary      $(OUT)/summary.txt"
	@cat $(OUT)/summary.txt
ifneq ($(EVAL),)
	@$(PY) -c "import json, sys; r = json.load(open(sys.argv[1])); \
	[print(f'downstream   {t}: acc {m[\"acc\"]:.3f}, acc_norm {m[\"acc_norm\"]:.3f} (chance 0.250; {sys.argv[1]})') \
	 for t, m in r['results'].items()]" $(EVAL)
endif

pretrain-data: $(MIX)
pretrain-train: $(OUT)/train.done

# 1. The built-in corpus: generated, deterministic from SEED.
$(DEFAULT_SOURCES) &: | setup
	$(BIN)/llm-prep sample-corpus -o $(RAW) --docs $(SAMPLE_DOCS) --seed $(SEED) --force

# 2. A BPE tokenizer trained on all sources.
$(TOKENIZER): $(SOURCES) | setup
	$(BIN)/llm-prep tokenizer train $(SOURCES) --vocab-size $(VOCAB) -o $@ --force

# 3. One tokenized dataset per source (Megatron .bin/.idx + sidecar).
define json2bin_rule
$(DATA)/$(call stem,$(1))_text_document.bin: $(1) $(TOKENIZER) | setup
	@mkdir -p $(DATA)
	$(BIN)/llm-prep json2bin $(1) -t $(TOKENIZER) -o $(DATA)/$(call stem,$(1)) --append-eod --force -q
endef
$(foreach s,$(SOURCES),$(eval $(call json2bin_rule,$(s))))

# 4. The blend: weights, sequence length, samples, valid split.
$(MIX): $(addsuffix .bin,$(PREFIXES)) | setup
	$(BIN)/llm-mix $(PREFIXES) --weights $(WEIGHTS) --seq-length $(SEQ) --num-samples $(SAMPLES) \
		--valid-samples $(VALID_SAMPLES) --seed $(SEED) -o $@ --force --explain >&2
	$(BIN)/llm-mix $(PREFIXES) --weights $(WEIGHTS) --seq-length $(SEQ) --num-samples $(SAMPLES) \
		--valid-samples $(VALID_SAMPLES) --seed $(SEED) -o $@ --force

# 5. Training. A changed input starts the run over (--force) unless RESUME=auto|latest|STEP. The pipeline's
#    own choices reach the model: its vocabulary is the tokenizer's (VOCAB), its sequence length the mix's (SEQ).
$(OUT)/train.done: $(MIX) $(CONFIG) $(DS) | setup
	$(LAUNCH) $(CONFIG) --deepspeed $(DS) -o $(RUN) $(PIPELINE_SETS) $(TRAIN_MODE) $(TRAIN_ARGS) > $@.tmp
	mv $@.tmp $@

# 6. Checkpoint: verify it, convert it to a Hugging Face folder.
$(OUT)/verify.txt: $(OUT)/train.done
	$(BIN)/llm-ckpt verify $(RUN) > $@.tmp
	mv $@.tmp $@

$(HF)/config.json: $(OUT)/train.done
	$(BIN)/llm-ckpt convert $(RUN) --to hf -o $(HF) --tokenizer $(TOKENIZER) --force

# 7. Logs: a summary table and the curves.
$(OUT)/summary.txt: $(OUT)/train.done
	$(BIN)/llm-log summary $(RUN)/metrics.jsonl > $@.tmp
	mv $@.tmp $@

$(OUT)/curves.png: $(OUT)/train.done
	$(BIN)/llm-log plot $(RUN)/metrics.jsonl -o $@ --force

# 8. Downstream: lm-evaluation-harness on the final checkpoint (llm-ckpt eval), a task of the built-in corpus.
$(TASK): | setup
	@mkdir -p $(dir $@)
	$(BIN)/llm-prep sample-task -o $@ --seed $(SEED) --force

$(OUT)/eval.json: $(OUT)/train.done $(TASK)
	$(BIN)/llm-ckpt eval $(RUN) --tasks $(TASK) > $@.tmp
	mv $@.tmp $@

pretrain-clean:
	rm -rf $(OUT)
