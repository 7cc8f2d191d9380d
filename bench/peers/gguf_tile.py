#!/usr/bin/env python3
"""Carry a GGUF model in a fraction of its size, for timing runs only.

    gguf_tile.py pack SRC.gguf OUT.pack --fraction 0.3
    gguf_tile.py unpack OUT.pack DST.gguf

`pack` keeps SRC's header, metadata (tokenizer included) and tensor table
whole, and of each tensor's data its first whole rows, about `fraction` of
them (small tensors whole). `unpack` writes a GGUF file of SRC's exact size
and layout in which each tensor's data repeats those rows. Every tensor keeps
its type, shape and offset, and every block is one of the file's own blocks,
so every product costs what it costs on SRC, but the model is another
function: its text is meaningless. Use it only where the figures are
throughput and latency with a fixed number of output tokens (ignore_eos), as
bench/serve/compare_llama_server.sh runs; the device machines of
docs/benchmarks.md take 64 MiB per call, less than a 135M-parameter file.

Standard library only: the device machines have no `gguf` package.
"""
import argparse
import json
import os
import struct
import sys

GGUF_MAGIC = b"GGUF"
# GGUF value types: fixed sizes; 8 = string, 9 = array.
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
WHOLE_BELOW = 64 * 1024  # tensors up to this size are carried whole


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        values = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def string(self):
        n = self.take("Q")
        text = self.data[self.pos:self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return text

    def skip_value(self, kind):
        if kind in FIXED:
            self.pos += FIXED[kind]
        elif kind == STRING:
            n = self.take("Q")  # read before pos is: take moves it
            self.pos += n
        elif kind == ARRAY:
            item, count = self.take("I"), self.take("Q")
            if item in FIXED:
                self.pos += FIXED[item] * count
            else:
                for _ in range(count):
                    self.skip_value(item)
        else:
            raise ValueError(f"unknown GGUF value type {kind} at byte {self.pos}")


def tensor_table(path):
    """(data section start, file size, [(name, n_rows, offset in data)])."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(min(size, 64 << 20))  # metadata and table come first
    r = Reader(head)
    if r.take("4s") != GGUF_MAGIC:
        raise ValueError(f"{path}: not a GGUF file")
    version = r.take("I")
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is not supported")
    n_tensors, n_kv = r.take("Q"), r.take("Q")
    alignment = 32
    for _ in range(n_kv):
        key, kind = r.string(), r.take("I")
        if key == "general.alignment" and kind == 4:
            alignment = r.take("I")
        else:
            r.skip_value(kind)
    tensors = []
    for _ in range(n_tensors):
        name, n_dims = r.string(), r.take("I")
        dims = [r.take("Q") for _ in range(n_dims)]
        r.take("I")  # type: the rows' byte size follows from the offsets
        offset = r.take("Q")
        rows = 1
        for d in dims[1:]:
            rows *= d
        tensors.append((name, rows, offset))
    start = (r.pos + alignment - 1) // alignment * alignment
    return start, size, tensors


def pack(src, out, fraction):
    start, size, tensors = tensor_table(src)
    by_offset = sorted(tensors, key=lambda t: t[2])
    manifest, chunks = [], []
    with open(src, "rb") as f:
        header = f.read(start)
        for i, (name, rows, offset) in enumerate(by_offset):
            end = by_offset[i + 1][2] if i + 1 < len(by_offset) else size - start
            span = end - offset  # the tensor's bytes and its alignment padding
            keep = span
            if span > WHOLE_BELOW:
                row_bytes = max(1, span // rows)
                keep = max(1, round(fraction * rows)) * row_bytes
            f.seek(start + offset)
            chunks.append(f.read(keep))
            manifest.append({"name": name, "offset": offset, "span": span, "kept": keep})
    meta = json.dumps({"size": size, "start": start, "tensors": manifest}).encode()
    with open(out, "wb") as f:
        f.write(struct.pack("<QQ", len(header), len(meta)))
        f.write(header)
        f.write(meta)
        for chunk in chunks:
            f.write(chunk)
    kept = sum(t["kept"] for t in manifest)
    print(f"{out}: {len(manifest)} tensors, {kept / 2**20:.1f} of {(size - start) / 2**20:.1f} MiB of "
          f"data kept", file=sys.stderr)


def unpack(packed, dst):
    with open(packed, "rb") as f:
        header_len, meta_len = struct.unpack("<QQ", f.read(16))
        header = f.read(header_len)
        meta = json.loads(f.read(meta_len))
        with open(dst, "wb") as out:
            out.write(header)
            for t in meta["tensors"]:
                chunk = f.read(t["kept"])
                out.seek(meta["start"] + t["offset"])
                whole, rest = divmod(t["span"], len(chunk))
                out.write(chunk * whole + chunk[:rest])
            out.truncate(meta["size"])
    print(f"{dst}: {meta['size'] / 2**20:.1f} MiB", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--fraction", type=float, default=0.3)
    u = sub.add_parser("unpack")
    u.add_argument("packed")
    u.add_argument("dst")
    args = parser.parse_args()
    if args.command == "pack":
        if not 0 < args.fraction <= 1:
            parser.error(f"--fraction {args.fraction} is not in (0, 1]")
        pack(args.src, args.out, args.fraction)
    else:
        unpack(args.packed, args.dst)


if __name__ == "__main__":
    main()
