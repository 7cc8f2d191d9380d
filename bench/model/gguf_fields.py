"""What the GGUF-writing scripts beside this one share (gguf package,
PyPI): copying a file's metadata fields into a writer, and writing it out."""
import gguf


def copy_fields(reader, writer, keep):
    """Every field of `reader` whose key `keep(key)` accepts, as it is."""
    for key, field in reader.fields.items():
        if not keep(key):
            continue
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


def write_out(writer):
    """The header, the fields and the tensors `writer` holds, to its file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
