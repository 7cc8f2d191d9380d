#!/usr/bin/env python3
"""Write a GGUF file's matrices in another type, for timing a weight format's
paths on a real model.

    gguf_retype.py SRC.gguf DST.gguf [--type f16|bf16|q8_0|q5_1|q5_0|q4_1|q4_0]
        [--only SRC_TYPE]

Every 2-D tensor is dequantised (gguf's own dequantiser) and written as
16-bit floats (f16, bf16) or quantised again by gguf's own quantiser (the
32-weight formats); 1-D tensors (norms) as F32, as convert_hf_to_gguf
--outtype f16 does. Metadata (tokenizer included) is copied. The values are
SRC's, rounded to the type: the model's text stays close to SRC's, and each
product reads what a real file of the model in that type reads (e.g. q5_0:
the layers of a small model's Q4_K_M, whose widths are not multiples of
Q4_K's 256). --only (e.g. q4_1) retypes only the matrices of that type and
copies every other tensor as it is. Needs the `gguf` package (PyPI).
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
    quantised = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q5_1": gguf.GGMLQuantizationType.Q5_1,
                 "q5_0": gguf.GGMLQuantizationType.Q5_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
                 "q4_0": gguf.GGMLQuantizationType.Q4_0}
    parser.add_argument("--type", choices=["f16", "bf16", *quantised], default="f16")
    parser.add_argument("--only", help="retype only the matrices of this type (e.g. q4_1)")
    args = parser.parse_args()
    reader = gguf.GGUFReader(args.src)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode("utf-8")
    writer = gguf.GGUFWriter(args.dst, arch)
    copy_metadata(reader, writer)
    for t in reader.tensors:
        if args.only and t.tensor_type.name.lower() != args.only.lower():
            writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
            continue
        shape = [int(d) for d in reversed(t.shape)]
        values = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(shape)
        if values.ndim != 2:
            writer.add_tensor(t.name, values)
        elif args.type in quantised:
            kind = quantised[args.type]
            writer.add_tensor(t.name, gguf.quants.quantize(values, kind), raw_dtype=kind)
        elif args.type == "f16":
            writer.add_tensor(t.name, values.astype(np.float16))
        else:  # round to nearest even in the top 16 bits
            bits = values.view(np.uint32)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            writer.add_tensor(t.name, rounded, raw_dtype=gguf.GGMLQuantizationType.BF16)
    write_out(writer)


if __name__ == "__main__":
    main()
