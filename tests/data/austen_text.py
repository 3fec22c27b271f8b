"""Writes Debian's Jane Austen novels as one text file: the six character vectors of
r-cran-janeaustenr's data/Rdata.rdb, each its lines joined by "\n", joined by "\n".

    /usr/bin/python3 tests/data/austen_text.py Rdata.rdb austen.txt

The tests' corpus (build/test-data/corpus/austen.txt). Independent of titan's own reader
(data/rdata.c), which test_dataset checks against this file. The .rdb is a sequence of
records, each a 4-byte big-endian length and a zlib stream of one R object serialized in
XDR ("X\n", R Internals, "Serialization Formats"); the novels are the character vectors
(STRSXP, 16) among them, each element a CHARSXP (9): flags, byte length, bytes.
"""
import struct
import sys
import zlib

STRSXP, CHARSXP = 16, 9


def records(blob):
    """Yields each record's decompressed serialization."""
    while blob:
        stream = zlib.decompressobj()
        yield stream.decompress(blob[4:])
        blob = stream.unused_data


def character_vector(obj):
    """The elements of a serialized character vector, or None for any other object."""
    assert obj[:2] == b"X\n", "not an XDR serialization"
    version = struct.unpack(">i", obj[2:6])[0]
    at = 14
    if version == 3:
        at += 4 + struct.unpack(">i", obj[at:at + 4])[0]
    flags, length = struct.unpack(">ii", obj[at:at + 8])
    if flags & 0xFF != STRSXP:
        return None
    at += 8
    elements = []
    for _ in range(length):
        flags, size = struct.unpack(">ii", obj[at:at + 8])
        assert flags & 0xFF == CHARSXP and size >= 0, "an NA or non-string element"
        elements.append(obj[at + 8:at + 8 + size])
        at += 8 + size
    return elements


def main(rdb, out):
    with open(rdb, "rb") as f:
        novels = [v for v in map(character_vector, records(f.read())) if v is not None]
    assert len(novels) == 6, f"{rdb}: {len(novels)} character vectors, expected the 6 novels"
    with open(out, "wb") as f:
        f.write(b"\n".join(b"\n".join(lines) for lines in novels))


if __name__ == "__main__":
    main(*sys.argv[1:])
