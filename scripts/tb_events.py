"""Read and write the TensorBoard event files dpar's io::SummaryWriter produces.

A file is TFRecord framing around serialized tensorboard.Event messages
(lib/proto/tensorboard_event.proto):

    uint64 length (little endian) | uint32 masked CRC-32C of those 8 bytes |
    `length` bytes of data        | uint32 masked CRC-32C of the data

Every CRC is checked. A torn or corrupt record at the very end of a file is what a run killed
mid-write leaves behind: it is skipped and reported. Damage followed by more data means the
file itself is broken, and reading it raises EventFileError naming the file and byte offset.

The Python classes are generated from the project's .proto at run time with `protoc`, so the
reader cannot drift from the C++ writer and no generated code is checked in.
"""
import importlib.util
import os
import struct
import subprocess
import tempfile

import crc32c

DEFAULT_PROTO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib", "proto",
                             "tensorboard_event.proto")
FILE_VERSION = "brain.Event:2"
_HEADER = struct.Struct("<QI")  # length, masked CRC of the length
_FOOTER = struct.Struct("<I")   # masked CRC of the data


class EventFileError(Exception):
    """A file that cannot be read: missing, mid-file corruption, protoc failing."""

    def __init__(self, path, what):
        super().__init__(f"{path}: {what}")
        self.path = path
        self.what = what


def masked_crc(data):
    # TFRecord rotates and offsets the CRC so that a CRC over data that holds CRCs stays well
    # distributed.
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data):
    """One TFRecord: `data` with its length and both checksums."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + _FOOTER.pack(masked_crc(data))


_generated = {}  # proto path -> generated module: protoc runs once per process


def load_proto(proto_path=None):
    """Compiles the .proto with protoc and imports the generated tensorboard_event_pb2."""
    proto_path = os.path.abspath(proto_path or DEFAULT_PROTO)
    if proto_path in _generated:
        return _generated[proto_path]
    if not os.path.isfile(proto_path):
        raise EventFileError(proto_path, "no such .proto file (pass --proto PATH)")
    name = os.path.splitext(os.path.basename(proto_path))[0] + "_pb2"
    with tempfile.TemporaryDirectory(prefix="tb_events.") as out_dir:
        try:
            subprocess.run(["protoc", f"--python_out={out_dir}",
                            f"--proto_path={os.path.dirname(proto_path)}",
                            os.path.basename(proto_path)],
                           check=True, capture_output=True, text=True)
        except FileNotFoundError:
            raise EventFileError(proto_path, "protoc not found (apt-get install protobuf-compiler)")
        except subprocess.CalledProcessError as e:
            raise EventFileError(proto_path, f"protoc failed: {e.stderr.strip()}")
        # Executing the module loads everything into memory, so the temp dir can go afterwards.
        spec = importlib.util.spec_from_file_location(name, os.path.join(out_dir, name + ".py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    _generated[proto_path] = module
    return module


def _records(path, data, problems):
    """Yields (offset, payload) of every intact record; see the module doc for damage."""
    offset = 0
    while offset < len(data):
        rest = len(data) - offset
        if rest < _HEADER.size:
            problems.append(f"{path}: skipped a truncated record header at byte offset {offset} "
                            f"({rest} bytes; a run killed mid-write?)")
            return
        length, length_crc = _HEADER.unpack_from(data, offset)
        if length_crc != masked_crc(data[offset:offset + 8]):
            # The length cannot be trusted, so where the next record would start is unknown. Only
            # a zero-filled tail (what a crash can leave after the last write) is benign.
            if data[offset:].strip(b"\0"):
                raise EventFileError(path, f"corrupt record length (CRC mismatch) at byte offset "
                                           f"{offset}")
            problems.append(f"{path}: skipped {rest} zero bytes at byte offset {offset}")
            return
        end = offset + _HEADER.size + length + _FOOTER.size
        if end > len(data):
            problems.append(f"{path}: skipped a truncated record at byte offset {offset} "
                            f"({rest} of {end - offset} bytes; a run killed mid-write?)")
            return
        payload = data[offset + _HEADER.size:end - _FOOTER.size]
        if _FOOTER.unpack_from(data, end - _FOOTER.size)[0] != masked_crc(payload):
            if end < len(data):
                raise EventFileError(path, f"corrupt record (data CRC mismatch) at byte offset "
                                           f"{offset}, followed by {len(data) - end} more bytes")
            problems.append(f"{path}: skipped the last record at byte offset {offset} "
                            f"(data CRC mismatch)")
            return
        yield offset, payload
        offset = end


def read_events(path, proto_path=None):
    """Returns ([(wall_time, step, tag, value)...] in file order, [problem...])."""
    pb = load_proto(proto_path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise EventFileError(path, e.strerror)
    problems = []
    scalars = []
    for offset, payload in _records(path, data, problems):
        event = pb.Event()
        try:
            event.ParseFromString(payload)
        except Exception as e:  # protobuf's DecodeError differs between implementations
            # The CRC matched, so these are the bytes the writer meant: not a torn write.
            raise EventFileError(path, f"record at byte offset {offset} is not a "
                                       f"tensorboard.Event: {e}")
        if event.WhichOneof("what") != "summary":
            continue  # file_version, or something a newer writer adds
        for value in event.summary.value:
            if value.WhichOneof("value") == "simple_value":
                scalars.append((event.wall_time, event.step, value.tag, value.simple_value))
    return scalars, problems


def write_events(path, scalars, proto_path=None):
    """Writes file_version, then one record per run of consecutive scalars sharing
    (wall_time, step), as the trainer writes one record per log line."""
    pb = load_proto(proto_path)
    records = [pb.Event(wall_time=scalars[0][0] if scalars else 0.0, file_version=FILE_VERSION)]
    for wall_time, step, tag, value in scalars:
        last = records[-1]
        if not (last.HasField("summary") and (last.wall_time, last.step) == (wall_time, step)):
            last = pb.Event(wall_time=wall_time, step=step)
            records.append(last)
        last.summary.value.add(tag=tag, simple_value=value)
    with open(path, "wb") as f:
        for event in records:
            f.write(frame(event.SerializeToString()))
