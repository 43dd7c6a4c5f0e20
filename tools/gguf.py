"""A small, self-contained GGUF reader and writer built on numpy.

Only what kvllm's tools need is supported: every metadata value type, and the
tensor types F32, F16, BF16, Q8_0 and Q4_0.  All multi-byte values are
little-endian.

Conventions used throughout:

* A tensor's *shape* is its numpy shape, outermost dimension first.  GGUF
  stores the reverse (``ne``, innermost first), so a 2-D weight of shape
  ``(n_out, n_in)`` is written with ``ne = [n_in, n_out]``.
* A metadata value's *type descriptor* is a ``ValueType`` for scalars and a
  tuple ``(ValueType.ARRAY, element_descriptor)`` for arrays, so nested
  arrays are described by nested tuples.

The writer streams: metadata and tensor descriptions are declared first, the
header is written, then the tensors' data is written one tensor at a time in
declaration order, so a caller never needs to hold more than one tensor.
"""

import enum
import struct

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"
SUPPORTED_VERSIONS = (2, 3)

# Quantization block length shared by Q8_0 and Q4_0.
QK = 32


class ValueType(enum.IntEnum):
    """GGUF metadata value types."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# struct format of every fixed-size scalar value type.
_SCALAR_FORMATS = {
    ValueType.UINT8: "<B",
    ValueType.INT8: "<b",
    ValueType.UINT16: "<H",
    ValueType.INT16: "<h",
    ValueType.UINT32: "<I",
    ValueType.INT32: "<i",
    ValueType.FLOAT32: "<f",
    ValueType.BOOL: "<?",
    ValueType.UINT64: "<Q",
    ValueType.INT64: "<q",
    ValueType.FLOAT64: "<d",
}


class GGMLType(enum.IntEnum):
    """The ggml tensor types this module can encode and decode."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q8_0 = 8
    BF16 = 30


# (elements per block, bytes per block) of each tensor type.
_BLOCK_LAYOUT = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.BF16: (1, 2),
    GGMLType.Q8_0: (QK, 2 + QK),
    GGMLType.Q4_0: (QK, 2 + QK // 2),
}

# Structured views of one quantized block: an f16 scale then the quants.
_Q8_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", (QK,))])
_Q4_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (QK // 2,))])


class GGUFError(Exception):
    """Raised for malformed files and unsupported or invalid requests."""


def _align(offset, alignment):
    return (offset + alignment - 1) // alignment * alignment


def tensor_nbytes(shape, ggml_type):
    """Number of bytes a tensor of numpy `shape` occupies as `ggml_type`."""
    ggml_type = GGMLType(ggml_type)
    block_elems, block_bytes = _BLOCK_LAYOUT[ggml_type]
    n_elems = int(np.prod(shape, dtype=np.int64))
    inner = shape[-1] if len(shape) else 1
    if inner % block_elems:
        raise GGUFError(
            f"{ggml_type.name} needs the innermost dimension to be a "
            f"multiple of {block_elems}, got shape {tuple(shape)}")
    return n_elems // block_elems * block_bytes


# ---------------------------------------------------------------------------
# Encoding (float -> raw bytes) and decoding (raw bytes -> float64).
# ---------------------------------------------------------------------------

def _round_half_away(v):
    """C's roundf() on a float32 array: halves round away from zero.

    Splitting off the fraction keeps this exact: adding 0.5 first would itself
    round for values just below one half.
    """
    mag = np.abs(v)
    whole = np.floor(mag)
    whole += (mag - whole) >= np.float32(0.5)
    return np.copysign(whole, v)


def quantize_q8_0(x):
    """Q8_0-encode a float array whose size is a multiple of 32.

    Follows ggml's reference quantizer: per block d = max|x| / 127 and
    q = round(x / d), computed in float32 with the unrounded scale; only the
    stored d is rounded to f16.
    """
    blocks = np.asarray(x, dtype=np.float32).reshape(-1, QK)
    d = np.abs(blocks).max(axis=1) / np.float32(127)
    inv_d = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    out = np.empty(len(blocks), dtype=_Q8_0_BLOCK)
    out["d"] = d
    out["qs"] = _round_half_away(blocks * inv_d[:, None])
    return out.view(np.uint8)


def quantize_q4_0(x):
    """Q4_0-encode a float array whose size is a multiple of 32.

    Follows ggml's quantize_row_q4_0_reference: the scale comes from the
    signed element of largest magnitude (first one on ties) so that it maps
    to quant 0 exactly, d = max / -8, and q = min(15, trunc(x / d + 8.5)).
    Byte j holds element j in its low nibble and element j + 16 in its high
    nibble.
    """
    blocks = np.asarray(x, dtype=np.float32).reshape(-1, QK)
    rows = np.arange(len(blocks))
    signed_max = blocks[rows, np.abs(blocks).argmax(axis=1)]
    d = signed_max / np.float32(-8)
    inv_d = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    # The shifted values are non-negative, so the int cast truncates exactly
    # like C's (int8_t) conversion does.
    q = np.minimum(15, (blocks * inv_d[:, None] + np.float32(8.5))
                   .astype(np.uint8))
    out = np.empty(len(blocks), dtype=_Q4_0_BLOCK)
    out["d"] = d
    out["qs"] = q[:, :QK // 2] | (q[:, QK // 2:] << 4)
    return out.view(np.uint8)


def float_to_bf16_bits(x):
    """Round float32 values to bfloat16 (nearest, ties to even), as uint16.

    NaNs are kept quiet NaNs instead of being rounded into infinities.
    """
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16
    rounded = np.where(np.isnan(x), (bits >> 16) | 0x40, rounded)
    return rounded.astype(np.uint16)


def encode(x, ggml_type):
    """Encode a float array (any shape, flattened) as raw `ggml_type` bytes."""
    ggml_type = GGMLType(ggml_type)
    flat = np.asarray(x).reshape(-1)
    if ggml_type == GGMLType.F32:
        raw = flat.astype("<f4")
    elif ggml_type == GGMLType.F16:
        raw = flat.astype("<f2")
    elif ggml_type == GGMLType.BF16:
        raw = float_to_bf16_bits(flat).astype("<u2")
    elif ggml_type == GGMLType.Q8_0:
        raw = quantize_q8_0(flat)
    else:
        raw = quantize_q4_0(flat)
    return raw.view(np.uint8)


def decode(raw, ggml_type):
    """Decode raw `ggml_type` bytes into a flat float64 array."""
    ggml_type = GGMLType(ggml_type)
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if ggml_type == GGMLType.F32:
        return raw.view("<f4").astype(np.float64)
    if ggml_type == GGMLType.F16:
        return raw.view("<f2").astype(np.float64)
    if ggml_type == GGMLType.BF16:
        # bfloat16 is the top half of a float32.
        bits = raw.view("<u2").astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    if ggml_type == GGMLType.Q8_0:
        blocks = raw.view(_Q8_0_BLOCK)
        d = blocks["d"].astype(np.float64)[:, None]
        return (d * blocks["qs"]).reshape(-1)
    blocks = raw.view(_Q4_0_BLOCK)
    d = blocks["d"].astype(np.float64)[:, None]
    qs = blocks["qs"]
    # Low nibbles are elements 0..15 of the block, high nibbles 16..31.
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int64) - 8
    return (d * q).reshape(-1)


# ---------------------------------------------------------------------------
# Writer
# ---------------------------------------------------------------------------

def _pack_string(s):
    data = s.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _pack_value(value, vtype):
    """Serialize `value` described by type descriptor `vtype`."""
    if isinstance(vtype, tuple):
        kind, elem_type = vtype
        if kind != ValueType.ARRAY:
            raise GGUFError(f"bad type descriptor {vtype!r}")
        elem_code = elem_type[0] if isinstance(elem_type, tuple) else elem_type
        parts = [struct.pack("<IQ", int(elem_code), len(value))]
        if elem_type in _SCALAR_FORMATS:
            # One vectorised conversion for long numeric arrays.
            fmt = _SCALAR_FORMATS[ValueType(elem_type)]
            dtype = np.dtype(fmt[1:]).newbyteorder("<")
            parts.append(np.asarray(value, dtype=dtype).tobytes())
        else:
            parts.extend(_pack_value(v, elem_type) for v in value)
        return b"".join(parts)
    vtype = ValueType(vtype)
    if vtype == ValueType.STRING:
        return _pack_string(value)
    if vtype == ValueType.ARRAY:
        raise GGUFError("arrays need a (ValueType.ARRAY, element) descriptor")
    return struct.pack(_SCALAR_FORMATS[vtype], value)


def _type_code(vtype):
    return int(vtype[0] if isinstance(vtype, tuple) else vtype)


class GGUFWriter:
    """Streams a GGUF file.

    Usage: ``add_*`` metadata and ``add_tensor_info`` for every tensor, then
    ``write_header()``, then ``write_tensor`` for each tensor in the order it
    was declared, then ``close()`` (or use the writer as a context manager).
    The data alignment is taken from the ``general.alignment`` metadata value
    when one is added, and is 32 otherwise.
    """

    # Elements encoded per step when writing a tensor; bounds the size of
    # encoding temporaries independently of the tensor's size.
    CHUNK_ELEMENTS = 1 << 20

    def __init__(self, path, version=3):
        if version not in SUPPORTED_VERSIONS:
            raise GGUFError(f"unsupported GGUF version {version}")
        self.version = version
        self.alignment = DEFAULT_ALIGNMENT
        self._file = open(path, "wb")
        self._kv = []
        self._keys = set()
        self._tensors = []
        self._data_size = 0
        self._next_tensor = None  # index of the next tensor to write
        self._data_start = None  # file position of the data section

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            # Don't mask the original error with close()'s completeness check.
            self._file.close()

    # -- metadata -----------------------------------------------------------

    def add(self, key, value, vtype):
        """Add metadata `key` = `value` with type descriptor `vtype`."""
        if self._next_tensor is not None:
            raise GGUFError("metadata must be added before write_header()")
        if key in self._keys:
            raise GGUFError(f"duplicate metadata key {key!r}")
        if key == ALIGNMENT_KEY:
            if vtype != ValueType.UINT32 or value <= 0 or value % 8:
                raise GGUFError(f"{ALIGNMENT_KEY} must be a u32 multiple of 8")
            if self._tensors:
                raise GGUFError(f"set {ALIGNMENT_KEY} before adding tensors")
            self.alignment = value
        self._keys.add(key)
        self._kv.append((key, value, vtype))

    def add_uint32(self, key, value):
        self.add(key, value, ValueType.UINT32)

    def add_int32(self, key, value):
        self.add(key, value, ValueType.INT32)

    def add_float32(self, key, value):
        self.add(key, value, ValueType.FLOAT32)

    def add_bool(self, key, value):
        self.add(key, value, ValueType.BOOL)

    def add_string(self, key, value):
        self.add(key, value, ValueType.STRING)

    def add_array(self, key, values, elem_type):
        self.add(key, values, (ValueType.ARRAY, elem_type))

    # -- tensors ------------------------------------------------------------

    def add_tensor_info(self, name, shape, ggml_type):
        """Declare a tensor of numpy `shape`, stored as `ggml_type`."""
        if self._next_tensor is not None:
            raise GGUFError("tensors must be declared before write_header()")
        if any(t["name"] == name for t in self._tensors):
            raise GGUFError(f"duplicate tensor {name!r}")
        shape = tuple(int(n) for n in shape)
        nbytes = tensor_nbytes(shape, ggml_type)
        offset = _align(self._data_size, self.alignment)
        self._tensors.append(dict(name=name, shape=shape,
                                  ggml_type=GGMLType(ggml_type),
                                  offset=offset, nbytes=nbytes))
        self._data_size = offset + nbytes

    def write_header(self):
        """Write the header, metadata and tensor descriptions."""
        if self._next_tensor is not None:
            raise GGUFError("header already written")
        out = [MAGIC, struct.pack("<IQQ", self.version, len(self._tensors),
                                  len(self._kv))]
        for key, value, vtype in self._kv:
            out.append(_pack_string(key))
            out.append(struct.pack("<I", _type_code(vtype)))
            out.append(_pack_value(value, vtype))
        for t in self._tensors:
            out.append(_pack_string(t["name"]))
            ne = t["shape"][::-1]
            out.append(struct.pack(f"<I{len(ne)}Q", len(ne), *ne))
            out.append(struct.pack("<IQ", int(t["ggml_type"]), t["offset"]))
        header = b"".join(out)
        self._file.write(header)
        self._pad(len(header))
        self._data_start = self._file.tell()
        self._next_tensor = 0

    def write_tensor(self, name, values):
        """Encode float `values` (of the declared shape) and write them."""
        if self._next_tensor is None:
            raise GGUFError("write_header() must come before write_tensor()")
        if self._next_tensor >= len(self._tensors):
            raise GGUFError(f"tensor {name!r} was never declared")
        t = self._tensors[self._next_tensor]
        if t["name"] != name:
            raise GGUFError(f"expected tensor {t['name']!r}, got {name!r}")
        values = np.asarray(values)
        if values.shape != t["shape"]:
            raise GGUFError(f"tensor {name!r} has shape {values.shape}, "
                            f"declared {t['shape']}")
        # Whole blocks never straddle a chunk boundary: CHUNK_ELEMENTS is a
        # multiple of the block length.
        flat = values.reshape(-1)
        for start in range(0, flat.size, self.CHUNK_ELEMENTS):
            chunk = flat[start:start + self.CHUNK_ELEMENTS]
            self._file.write(encode(chunk, t["ggml_type"]).tobytes())
        self._pad(self._file.tell() - self._data_start)
        self._next_tensor += 1

    def _pad(self, position):
        self._file.write(b"\0" * (_align(position, self.alignment) - position))

    def close(self):
        """Finish the file; complains if declared tensors were not written."""
        if self._file.closed:
            return
        self._file.close()
        written = self._next_tensor or 0
        if written != len(self._tensors):
            raise GGUFError(f"only {written} of {len(self._tensors)} "
                            "declared tensors were written")


# ---------------------------------------------------------------------------
# Reader
# ---------------------------------------------------------------------------

class TensorInfo:
    """One tensor's description; `data_offset` is absolute in the file.

    Tensors of types this module cannot decode are still listed: their
    `ggml_type` is the plain integer code and their `nbytes` is None.
    """

    def __init__(self, name, shape, ggml_type, offset, data_offset):
        self.name = name
        self.shape = shape
        self.ggml_type = ggml_type
        self.offset = offset
        self.data_offset = data_offset
        self.nbytes = (tensor_nbytes(shape, ggml_type)
                       if isinstance(ggml_type, GGMLType) else None)

    def __repr__(self):
        type_name = getattr(self.ggml_type, "name", self.ggml_type)
        return (f"TensorInfo({self.name!r}, shape={self.shape}, "
                f"type={type_name}, offset={self.offset})")


class _Cursor:
    """Sequential little-endian decoding over a byte buffer."""

    def __init__(self, buf):
        self.buf = buf
        self.pos = 0

    def take(self, n):
        if self.pos + n > len(self.buf):
            raise GGUFError("file is truncated")
        data = self.buf[self.pos:self.pos + n]
        self.pos += n
        return data

    def unpack(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def string(self):
        (n,) = self.unpack("<Q")
        try:
            return bytes(self.take(n)).decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"invalid UTF-8 string in file: {e}") from None

    def value(self, code):
        """Read a value of type `code`; returns (value, type descriptor)."""
        try:
            vtype = ValueType(code)
        except ValueError:
            raise GGUFError(f"unknown metadata value type {code}") from None
        if vtype == ValueType.STRING:
            return self.string(), vtype
        if vtype != ValueType.ARRAY:
            (v,) = self.unpack(_SCALAR_FORMATS[vtype])
            return v, vtype
        elem_code, count = self.unpack("<IQ")
        if elem_code in _SCALAR_FORMATS:
            fmt = _SCALAR_FORMATS[ValueType(elem_code)]
            dtype = np.dtype(fmt[1:]).newbyteorder("<")
            data = np.frombuffer(self.take(count * dtype.itemsize), dtype)
            return data.tolist(), (vtype, ValueType(elem_code))
        items = []
        elem_type = ValueType(elem_code) if count == 0 else None
        for _ in range(count):
            item, elem_type = self.value(elem_code)
            items.append(item)
        return items, (vtype, elem_type)


class GGUFReader:
    """Reads a GGUF file; tensor data stays memory-mapped until decoded.

    Attributes: `version`, `metadata` (key -> Python value; arrays are
    lists), `types` (key -> type descriptor), `alignment`, `data_start`
    (absolute offset of the data section) and `tensors` (name -> TensorInfo,
    in file order).
    """

    def __init__(self, path):
        self.path = path
        self._map = np.memmap(path, dtype=np.uint8, mode="r")
        cur = _Cursor(memoryview(self._map))
        if bytes(cur.take(4)) != MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (bad magic)")
        (self.version,) = cur.unpack("<I")
        if self.version not in SUPPORTED_VERSIONS:
            raise GGUFError(f"{path}: unsupported GGUF version {self.version}")
        n_tensors, n_kv = cur.unpack("<QQ")

        self.metadata = {}
        self.types = {}
        for _ in range(n_kv):
            key = cur.string()
            (code,) = cur.unpack("<I")
            self.metadata[key], self.types[key] = cur.value(code)

        self.alignment = self.metadata.get(ALIGNMENT_KEY, DEFAULT_ALIGNMENT)
        if self.alignment <= 0:
            raise GGUFError(f"{path}: invalid alignment {self.alignment}")

        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            (n_dims,) = cur.unpack("<I")
            ne = cur.unpack(f"<{n_dims}Q")
            code, offset = cur.unpack("<IQ")
            try:
                ggml_type = GGMLType(code)
            except ValueError:
                ggml_type = code  # listed, but its data can't be decoded
            infos.append((name, tuple(ne[::-1]), ggml_type, offset))

        self.data_start = _align(cur.pos, self.alignment)
        self.tensors = {}
        for name, shape, ggml_type, offset in infos:
            if offset % self.alignment:
                raise GGUFError(f"{path}: tensor {name!r} offset {offset} "
                                "is not aligned")
            info = TensorInfo(name, shape, ggml_type, offset,
                              self.data_start + offset)
            end = info.data_offset + (info.nbytes or 0)
            if end > len(self._map):
                raise GGUFError(f"{path}: tensor {name!r} runs past the end "
                                "of the file")
            self.tensors[name] = info

    def raw(self, name):
        """The tensor's stored bytes (a read-only memory-mapped view)."""
        info = self._info(name)
        return self._map[info.data_offset:info.data_offset + info.nbytes]

    def tensor(self, name, rows=None):
        """Decode a tensor to float64 in its numpy shape.

        `rows` optionally selects along the outermost dimension (an index
        array or a slice), decoding only those rows.
        """
        info = self._info(name)
        if rows is None:
            return decode(self.raw(name), info.ggml_type).reshape(info.shape)
        n_rows = info.shape[0]
        raw = self.raw(name).reshape(n_rows, info.nbytes // n_rows)
        picked = raw[rows]
        return decode(picked, info.ggml_type).reshape(
            picked.shape[:-1] + info.shape[1:])

    def _info(self, name):
        try:
            info = self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: no tensor {name!r}") from None
        if info.nbytes is None:
            raise GGUFError(f"{self.path}: tensor {name!r} has unsupported "
                            f"ggml type {info.ggml_type}")
        return info
