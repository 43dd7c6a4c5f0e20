"""SentencePiece-style vocabulary shared by training, export and evaluation.

The vocabulary is stored as JSON (a list of pieces, scores and types) and
encoded with exactly the algorithm kvllm's Tokenizer::Encode uses (see
src/tokenizer/tokenizer.cc), so that the ids the model is trained on are the
ids kvllm feeds it:

1. every ' ' becomes U+2581 ("▁") and one "▁" is prepended;
2. the text is split into UTF-8 characters;
3. repeatedly, the adjacent pair whose concatenation is a vocabulary piece
   with the highest score is merged (ties: the leftmost pair);
4. each remaining symbol becomes its piece's id, or its UTF-8 bytes become
   byte tokens <0xNN>.
"""

import heapq
import json
import re

SPACE = "\u2581"

# GGUF token types (llama.cpp's llama_token_type).
TYPE_NORMAL = 1
TYPE_UNKNOWN = 2
TYPE_CONTROL = 3
TYPE_BYTE = 6

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2

# Chunks are "\n", or an optional "▁" followed by a run of letters, of
# digits, or of other characters (punctuation, tabs), as SentencePiece splits
# by Unicode script.  The tokenizer learns pieces only inside chunks, so no
# piece can span a chunk boundary (a piece holds one class of character and
# a "▁" only first); hence kvllm's score-greedy merge over the whole text acts
# on each chunk independently, which lets the encoder cache chunks and encode
# megabytes of text quickly.
_LETTER = r"[^\W\d_]"
_DIGIT = r"\d"
_OTHER = r"[^\w\n" + SPACE + r"]|_"
# The final "." (any character, itself a chunk) makes the chunks cover the
# text exactly, whatever characters it holds.
CHUNK_RE = re.compile("|".join(
    [r"\n"] + [SPACE + "?(?:" + c + ")+" for c in (_LETTER, _DIGIT, _OTHER)]
    + ["."]), re.DOTALL)


def normalize(text):
    """kvllm's normalization: spaces to "▁", plus the "▁" prefix."""
    return SPACE + text.replace(" ", SPACE)


def chunks(normalized):
    """Splits normalized text into the chunks merges never cross."""
    return CHUNK_RE.findall(normalized)


class Vocab:
    """Pieces, scores and GGUF token types, with kvllm's encoder."""

    def __init__(self, pieces, scores, types):
        self.pieces = pieces
        self.scores = scores
        self.types = types
        self.piece_to_id = {p: i for i, p in enumerate(pieces)
                            if types[i] == TYPE_NORMAL}
        self.byte_ids = {}
        for i, (p, t) in enumerate(zip(pieces, types)):
            if t == TYPE_BYTE:
                self.byte_ids[int(p[3:5], 16)] = i
        self._cache = {}

    @classmethod
    def load(cls, path):
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        return cls(d["pieces"], d["scores"], d["types"])

    def save(self, path):
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"pieces": self.pieces, "scores": self.scores,
                       "types": self.types}, f, ensure_ascii=False)

    def __len__(self):
        return len(self.pieces)

    def encode(self, text):
        """Token ids of `text` without BOS (kvllm's Encode, no specials)."""
        if not text:
            return []
        ids = []
        for chunk in chunks(normalize(text)):
            cached = self._cache.get(chunk)
            if cached is None:
                cached = self._encode_chunk(chunk)
                self._cache[chunk] = cached
            ids.extend(cached)
        return ids

    def _encode_chunk(self, chunk):
        symbols = list(chunk)  # one symbol per character, like kvllm
        alive = [True] * len(symbols)
        nxt = list(range(1, len(symbols))) + [-1]
        prv = list(range(-1, len(symbols) - 1))
        heap = []

        def push(left, right):
            if left < 0 or right < 0:
                return
            merged = symbols[left] + symbols[right]
            pid = self.piece_to_id.get(merged)
            if pid is not None:
                # Max-heap on score, then min on position (leftmost wins);
                # the merged string detects stale candidates.
                heapq.heappush(heap, (-self.scores[pid], left, right, merged))

        for i in range(len(symbols) - 1):
            push(i, i + 1)
        while heap:
            _, left, right, merged = heapq.heappop(heap)
            if (not alive[left] or not alive[right] or nxt[left] != right
                    or symbols[left] + symbols[right] != merged):
                continue
            symbols[left] = merged
            alive[right] = False
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])

        ids = []
        i = 0
        while i >= 0:
            pid = self.piece_to_id.get(symbols[i])
            if pid is not None:
                ids.append(pid)
            else:
                ids.extend(self.byte_ids[b]
                           for b in symbols[i].encode("utf-8"))
            i = nxt[i]
        return ids

    def decode(self, ids):
        """Text of `ids`; the inverse of encode() for its output."""
        out = bytearray()
        for i in ids:
            t = self.types[i]
            if t == TYPE_BYTE:
                out.append(int(self.pieces[i][3:5], 16))
            elif t == TYPE_NORMAL:
                out.extend(self.pieces[i].replace(SPACE, " ").encode("utf-8"))
        text = out.decode("utf-8", errors="replace")
        return text[1:] if text.startswith(" ") else text
