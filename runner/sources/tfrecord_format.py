"""The TFRecord file format and the tf.train.Example message, read in plain Python (no TensorFlow).

Why not TensorFlow: data=tfrecord's files are checked before TensorFlow is imported (runner.sources.tfrecord),
so that a pattern that matches nothing, a file that is not TFRecord or a feature the records lack is one readable
error in a second, not a C++ stack trace after start-up. This module reads only what those checks need: record
framing (to count records by seeking past them, and to tell a TFRecord file from anything else) and the kind and
number of values of each feature of one Example.

A TFRecord file is a sequence of records: uint64 length, uint32 masked CRC-32C of the length, the data, uint32
masked CRC-32C of the data (all little-endian). An Example is Features{map<string, Feature>}, a Feature one of
BytesList (1), FloatList (2) or Int64List (3).
"""

import struct

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reversed
_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class NotTFRecord(ValueError):
    """The bytes are not TFRecord framing (the message says where it broke)."""


def _header(f, size: int) -> int | None:
    """The length of the record starting at f's position, its header checked; None at the end of the file."""
    start = f.tell()
    head = f.read(12)
    if not head:
        return None
    if len(head) < 12:
        raise NotTFRecord(f"{len(head)} stray bytes at offset {start} where a record header (12 bytes) should start")
    length, crc = struct.unpack("<QI", head)
    if masked_crc(head[:8]) != crc:
        raise NotTFRecord(f"the record header at offset {start} fails its checksum")
    if start + 16 + length > size:
        raise NotTFRecord(f"the record at offset {start} claims {length} bytes, past the end of the file (truncated?)")
    return length


def count_records(path: str) -> int:
    """Records in a local TFRecord file, seeking past each one's data (only the 8-byte headers are checksummed)."""
    import os

    size, n = os.path.getsize(path), 0
    with open(path, "rb") as f:
        while (length := _header(f, size)) is not None:
            f.seek(length + 4, 1)
            n += 1
    return n


def first_record(path: str) -> bytes | None:
    """The first record's data, both checksums verified; None for an empty file."""
    import os

    with open(path, "rb") as f:
        length = _header(f, os.path.getsize(path))
        if length is None:
            return None
        data = f.read(length)
        (crc,) = struct.unpack("<I", f.read(4))
    if masked_crc(data) != crc:
        raise NotTFRecord("the first record's data fails its checksum")
    return data


def damage_at(path: str, offset: int) -> tuple[int, str] | None:
    """(record number, what is wrong) when the record TensorFlow called corrupted or truncated at `offset` of a local
    TFRecord file is damaged there; None when it is not. TensorFlow gives a record's own offset when its header is
    bad and the offset of its data (12 bytes on) when the data is: seek from header to header up to it, then check
    that one record."""
    import os

    size, n = os.path.getsize(path), 0
    with open(path, "rb") as f:
        while (start := f.tell()) <= offset:
            try:
                length = _header(f, size)
            except NotTFRecord as err:
                return (n, str(err)) if start == offset else None  # before `offset`: TensorFlow would have named it
            if length is None:
                return None
            if offset in (start, start + 12):
                data = f.read(length)
                (crc,) = struct.unpack("<I", f.read(4))
                return (n, f"the data of the record at offset {start} fails its checksum") if masked_crc(data) != crc else None
            f.seek(length + 4, 1)
            n += 1
    return None


def write_records(path: str, records) -> int:
    """Write serialized records as a TFRecord file (tests and small files; runner.export uses TensorFlow's writer)."""
    n = 0
    with open(path, "wb") as f:
        for data in records:
            head = struct.pack("<Q", len(data))
            f.write(head + struct.pack("<I", masked_crc(head)) + data + struct.pack("<I", masked_crc(data)))
            n += 1
    return n


# --- protobuf wire format, only as deep as tf.train.Example goes ---
def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of each field: an int for varints, bytes for the other types."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            length, i = _varint(buf, i)
            value, i = buf[i : i + length], i + length
            if len(value) != length:
                raise ValueError("truncated field")
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            value, i = buf[i : i + width], i + width
        else:
            raise ValueError(f"wire type {wire} does not occur in an Example")
        yield number, wire, value


KINDS = {1: "bytes", 2: "float", 3: "int64"}  # Feature's oneof: bytes_list, float_list, int64_list


def _count(kind: str, wire: int, value) -> int:
    if kind == "float" and wire == 2:  # packed floats
        return len(value) // 4
    if kind == "int64" and wire == 2:  # packed varints
        return sum(1 for b in value if not b & 0x80)
    return 1


def example_features(data: bytes) -> dict[str, tuple[str, int]]:
    """{feature name: (bytes | float | int64, number of values)} of a serialized tf.train.Example.
    Raises ValueError when the bytes are not one."""
    found = {}
    for number, _, features in _fields(data):
        if number != 1 or not isinstance(features, bytes):
            raise ValueError("not a tf.train.Example (it has no features field)")
        for entry_number, _, entry in _fields(features):
            if entry_number != 1 or not isinstance(entry, bytes):
                raise ValueError("not a tf.train.Example (malformed features map)")
            name, feature = "", b""
            for k, _, v in _fields(entry):
                if k == 1:
                    name = v.decode("utf-8", "replace")
                elif k == 2:
                    feature = v
            kind, count = "empty", 0
            for kind_number, _, values in _fields(feature):
                kind = KINDS.get(kind_number, "unknown")
                count = sum(_count(kind, wire, v) for _, wire, v in _fields(values)) if kind in ("float", "int64", "bytes") else 0
            found[name] = (kind, count)
    return found
