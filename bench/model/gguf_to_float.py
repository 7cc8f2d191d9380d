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


def copy_metadata(reader, writer):
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer writes these itself
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            if field.types[1] == gguf.GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8", "surrogateescape") for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_array(key, values)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(key, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            writer.add_key_value(key, field.parts[field.data[0]].tolist()[0], kind)


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
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
