"""Hugging Face ``tokenizers`` tokenizers (tokenizer.json, HF folders, GPT-2 vocab.json + merges.txt).

``tokenizers`` is the general backend; gigatoken (Rust, several times faster) is used as the fast
backend when, and only when, it gives the same ids as ``tokenizers`` on a probe set of tricky
strings under the chosen special-token policy (see :mod:`llmtools.tokenize.base`).
"""

from __future__ import annotations

import threading

import numpy as np

from llmtools.errors import UsageError
from llmtools.tokenize.base import Tokenizer, as_str_list, flatten
from llmtools.tokenize.checks import check_vocabulary

# Checked before trusting gigatoken: whitespace runs, unicode, digits, contractions, specials, empties.
PROBES = [
    "",
    " ",
    "Hello world",
    "  leading and trailing spaces  ",
    "line one\nline two\n\n\ttabbed\r\nwindows",
    "I'm we'll they've don't 'quoted' \"double\"",
    "numbers 1234567 3.14159 1e-9 0x1F",
    "caf\u00e9 na\u00efve \u4e2d\u6587 \u65e5\u672c\u8a9e \U0001f600 \u0645\u0631\u062d\u0628\u0627",
    "   \n   \n",
    "a" * 300,
    "The quick brown fox jumps over the lazy dog. " * 4,
    "def f(x):\n    return x ** 2  # comment\n",
    "\u00a0non-breaking\u2003em\u200bzero-width",
]


FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")
"""Every flag an added token carries; the backends may treat each differently (gigatoken ignores
``single_word``), so every flagged token is probed in contexts that tell each flag apart."""
MAX_FLAGGED = 64
"""Added tokens with flags probed one by one; beyond this the fast backend declines (probing them all
would cost more than it saves)."""


def _flagged(token) -> bool:
    """A flag away from the default of its kind (a special token is not normalized; a plain one is)."""
    return bool(token.single_word or token.lstrip or token.rstrip or token.normalized == token.special)


def _contexts(name: str) -> list[str]:
    return [name, f"text{name}more", f" {name} ", f"{name}{name}\n{name}", f"a {name}b", f"a{name} b",
            f"{name}\u00e9{name}", f"\t {name}  \n", f"{name.upper()} {name.lower()}", f".{name}."]  # fmt: skip


def _probe_texts(specials: dict[str, int], added=()) -> list[str]:
    texts = list(PROBES)
    for name in list(specials)[:8]:
        texts += _contexts(name)
    for token in added:
        if _flagged(token) and token.content not in specials:
            texts += _contexts(token.content)
    return texts


def _gigatoken_input(texts):
    """FlatTexts as an awkward array of strings over the same buffers (gigatoken reads them in place,
    with no Python object per document); a list of str as it is."""
    offsets = getattr(texts, "offsets", None)
    if offsets is None:
        return texts
    import awkward as ak

    chars = ak.contents.NumpyArray(texts.data, parameters={"__array__": "char"})
    strings = ak.contents.ListOffsetArray(
        ak.index.Index64(offsets), chars, parameters={"__array__": "string"}
    )
    return ak.Array(strings)


class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` (post-processor and added tokens as configured)."""

    def __init__(
        self,
        tok,
        *,
        kind: str,
        source: str,
        name: str,
        hash: str,
        vocab_size: int,
        eod_id: int | None,
        bos_id: int | None,
        policy: str = "auto",
        backend: str = "auto",
        split_specials_by_default: bool = True,
        defer_probe: bool = False,
    ) -> None:
        self.tok = tok
        self.kind, self.source, self.name, self.hash = kind, source, name, hash
        self.vocab_size, self.eod_id, self.bos_id = int(vocab_size), eod_id, bos_id
        self.checked = check_vocabulary(
            tok.get_vocab(with_added_tokens=True), self.vocab_size, eod_id, bos_id, source
        )
        self.policy = policy
        self.requested_backend = backend
        added = tok.get_added_tokens_decoder()
        self.special_tokens = {t.content: i for i, t in added.items() if t.special}
        split = policy == "split" or (policy == "auto" and split_specials_by_default)
        if not split and hasattr(tok, "encode_special_tokens"):
            tok.encode_special_tokens = True  # special strings are plain text
        self._gigatoken = None
        self._candidate = None  # gigatoken, loaded, while its probe runs in a thread (defer_probe)
        self._probe_thread = None
        self._verdict_lock = threading.Lock()
        self._backend = "tokenizers"
        self._required = False
        self.fallback_reason = None
        if backend in ("auto", "gigatoken"):
            self._try_gigatoken(required=backend == "gigatoken", defer=defer_probe)

    @property
    def backend(self) -> str:
        self._settle()
        return self._backend

    @property
    def parallel_in_process(self) -> bool:
        """gigatoken's batch encode runs on its own thread pool with the GIL released: json2bin then
        encodes in threads of one process (a pool does not survive fork) instead of worker processes."""
        return self._gigatoken is not None or self._candidate is not None

    # -- fast backend ----------------------------------------------------------------------------
    def _try_gigatoken(self, required: bool, defer: bool) -> None:
        self._required = required
        try:
            import gigatoken
        except ImportError:
            self._decide(None, "gigatoken is not installed (pip install gigatoken)")
            return
        try:
            fast = gigatoken.Tokenizer.from_json(self._json_for_gigatoken())
        except Exception as error:  # noqa: BLE001 - any load failure means "not supported"
            self._decide(None, f"gigatoken cannot load this tokenizer ({error})")
            return
        if not defer:
            self._decide(fast, self._probe(fast))
            return
        # gigatoken's first encode in a process sets itself up (~0.4 CPU-s, GIL released): json2bin lets
        # that run beside its reading and JSON parsing. The first encode and ``backend`` wait for the
        # verdict; ``parallel_in_process`` assumes gigatoken meanwhile.
        self._candidate = fast
        result: list = []
        # Not a daemon: a daemon thread still inside gigatoken's Rust code when the interpreter finalizes
        # is torn down in the middle of that call, and the process aborts (SIGABRT, exit 134) after an
        # otherwise clean exit, e.g. an input error at the first line. The interpreter joins this
        # thread instead; the probe takes well under a second.
        self._probe_thread = threading.Thread(
            target=lambda: result.append(self._probe_safely(fast)), name="llmtools-probe"
        )
        self._probe_result = result
        self._probe_thread.start()

    def _probe(self, fast) -> str | None:
        """None when gigatoken's ids equal tokenizers' on the probe texts, else why not."""
        added = list(self.tok.get_added_tokens_decoder().values())
        flagged = sum(map(_flagged, added))
        if flagged > MAX_FLAGGED:
            return f"{flagged} added tokens carry flags ({', '.join(FLAGS)}); the probe checks at most {MAX_FLAGGED}"
        texts = _probe_texts(self.special_tokens, added)
        got = fast.encode_batch_list(texts, parallel=False)
        want = [e.ids for e in self.tok.encode_batch(texts)]
        if got != want:
            bad = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
            return f"gigatoken gives different ids than tokenizers for {texts[bad][:40]!r}"
        return None

    def _probe_safely(self, fast) -> str | None:
        try:
            return self._probe(fast)
        except Exception as error:  # noqa: BLE001 - reported as "not supported" by _settle
            return f"gigatoken failed on the probe texts ({type(error).__name__}: {error})"

    def _settle(self) -> None:
        """Wait for a deferred probe (from any thread) and apply its verdict; with ``--backend gigatoken``
        a failed probe raises here, every time."""
        if self._probe_thread is not None:
            with self._verdict_lock:
                if self._probe_thread is not None:
                    self._probe_thread.join()
                    fast, reason = self._candidate, (self._probe_result or ["probe did not finish"])[0]
                    self._candidate = self._probe_thread = None
                    self._decide(fast, reason)
        if self._required and self.fallback_reason:
            self._decide(None, self.fallback_reason)

    def _decide(self, fast, reason: str | None) -> None:
        if reason is None:
            self._gigatoken, self._backend = fast, "gigatoken"
            return
        self.fallback_reason = reason
        if self._required:
            raise UsageError(f"--backend gigatoken: {reason}")

    def _json_for_gigatoken(self) -> str:
        data = self.tok.to_str()
        if not self.tok.encode_special_tokens:
            return data
        # plain policy: gigatoken always cuts out added special tokens, so hide them from it (the probe
        # below still checks that the ids agree with tokenizers').
        import json

        config = json.loads(data)
        config["added_tokens"] = [t for t in config.get("added_tokens") or [] if not t.get("special")]
        return json.dumps(config)

    # -- encoding --------------------------------------------------------------------------------
    def encode_flat(self, texts: list[str], dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
        self._settle()
        if self._gigatoken is not None:
            # One Rust call; the awkward array's offsets and content are used without a Python loop.
            layout = self._gigatoken.encode_batch(_gigatoken_input(texts)).layout
            offsets = np.asarray(layout.offsets)
            flat = np.asarray(layout.content.data)[offsets[0] : offsets[-1]]
            return (flat if dtype is None else flat.astype(dtype, copy=False)), np.diff(offsets)
        return flatten(self._encode_list(as_str_list(texts)), dtype)

    def _encode_list(self, texts: list[str]) -> list[list[int]]:
        self._settle()
        return [e.ids for e in self.tok.encode_batch(texts)]

    def encode_plain(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)
