#!/usr/bin/env python3
"""Write a GGUF file's matrices as F16 or BF16, for timing the 16-bit paths.

    gguf_to_float.py SRC.gguf DST.gguf [--type f16|bf16]

Every 2-D tensor is dequantised (gguf's own dequantiser) and written as
16-bit floats; 1-D tensors (norms) as F32, as convert_hf_to_gguf
--outtype f16 does. Metadata (tokenizer included) is copied. The values are
SRC's, rounded to 16 bits: the model's text stays close to SRC's, and each
product reads what a real F16 / BF16 file of the model reads. Needs the
`gguf` package (PyPI).
"""
import argparse

import gguf
import numpy as np
from gguf_fields import copy_fields, write_out


def copy_metadata(reader, writer):
    # The writer writes GGUF.* and general.architecture itself.
    copy_fields(reader, writer,
                lambda key: not key.startswith("GGUF.") and key != "general.architecture")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("--type", choices=["f16", "bf16"], default="f16")
    args = parser.parse_args()
    reader = gguf.GGUFReader(args.src)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode("utf-8")
    writer = gguf.GGUFWriter(args.dst, arch)
    copy_metadata(reader, writer)
    for t in reader.tensors:
        shape = [int(d) for d in reversed(t.shape)]
        values = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(shape)
        if values.ndim != 2:
            writer.add_tensor(t.name, values)
        elif args.type == "f16":
            writer.add_tensor(t.name, values.astype(np.float16))
        else:  # round to nearest even in the top 16 bits
            bits = values.view(np.uint32)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            writer.add_tensor(t.name, rounded, raw_dtype=gguf.GGMLQuantizationType.BF16)
    write_out(writer)


if __name__ == "__main__":
    main()
