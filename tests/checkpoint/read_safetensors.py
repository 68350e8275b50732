#!/usr/bin/env python3
"""Reads the safetensors file zero exports, following the public safetensors format alone (Python stdlib:
struct and json), compares it with the engine's values, and checks the zero_export command line.

Usage: read_safetensors.py CHECKPOINT_FIXTURE ZERO_EXPORT"""

import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from xxh64 import xxh64  # noqa: E402

SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
         "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def read_safetensors(path):
    """(metadata, [(name, dtype, shape, values)] in header order), validating the layout as the reference does."""
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    if n > 100_000_000 or 8 + n > len(blob):
        fail("header length %d" % n)
    head = blob[8 : 8 + n]
    if (8 + n) % 8 != 0:
        fail("the data does not start at a multiple of 8 bytes")
    if not head.startswith(b"{"):
        fail("the header does not start with '{'")
    text = head.decode("utf-8")
    if not text.rstrip(" ").endswith("}"):
        fail("the header is not a JSON object padded with trailing spaces")
    header = json.loads(text)  # dicts keep the file's order
    data = blob[8 + n :]
    meta = header.pop("__metadata__", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        fail("__metadata__ must map strings to strings")
    tensors, spans = [], []
    for name, info in header.items():
        if set(info) != {"dtype", "shape", "data_offsets"}:
            fail("tensor %s has members %r" % (name, sorted(info)))
        b, e = info["data_offsets"]
        numel = 1
        for d in info["shape"]:
            numel *= d
        if e - b != numel * SIZES[info["dtype"]]:
            fail("tensor %s: offsets do not match its shape" % name)
        spans.append((b, e))
        raw = data[b:e]
        values = struct.unpack("<%df" % numel, raw) if info["dtype"] == "F32" else raw
        tensors.append((name, info["dtype"], info["shape"], values, raw))
    at = 0
    for b, e in sorted(spans):
        if b != at:
            fail("hole or overlap in the data at byte %d" % b)
        at = e
    if at != len(data):
        fail("the tensors do not fill the data buffer")
    if "zero.data_xxh64" in meta and meta["zero.data_xxh64"] != "%016x" % xxh64(data):
        fail("zero.data_xxh64 does not match the data")
    return meta, tensors


def run(args, expect):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != expect:
        fail("%s exited %d, expected %d\n%s%s" % (" ".join(args[1:]), r.returncode, expect, r.stdout, r.stderr))
    return r


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    fixture, tool = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([fixture, tmp], check=True)
        expected = json.load(open(os.path.join(tmp, "expected.json")))
        master = open(os.path.join(tmp, "expected_master.f32"), "rb").read()
        lib_file = os.path.join(tmp, "model.safetensors")
        meta, tensors = read_safetensors(lib_file)
        if meta.get("format") != "pt" or meta.get("zero.step") != str(expected["step"]):
            fail("metadata %r" % meta)
        if [t[0] for t in tensors] != [t["name"] for t in expected["tensors"]]:
            fail("names %r" % [t[0] for t in tensors])
        if [t[2] for t in tensors] != [t["shape"] for t in expected["tensors"]]:
            fail("shapes differ")
        if any(t[1] != "F32" for t in tensors):
            fail("a tensor is not F32")
        if b"".join(t[4] for t in tensors) != master:
            fail("values differ from the engine's full_params")
        values = [v for t in tensors for v in t[3]]
        if values != list(struct.unpack("<%df" % (len(master) // 4), master)):
            fail("decoded values differ")

        # The command-line tool writes the same bytes, and speaks the usual exit codes.
        ckpt, out = os.path.join(tmp, "ckpt"), os.path.join(tmp, "cli.safetensors")
        r = run([tool, ckpt, out, "--json"], 0)
        if json.loads(r.stdout.strip().splitlines()[-1])["tensors"] != len(tensors):
            fail("--json output " + r.stdout)
        if open(out, "rb").read() != open(lib_file, "rb").read():
            fail("zero_export and export_safetensors wrote different files")
        run([tool, ckpt, out], 1)  # exists, no --force
        run([tool, "--force", ckpt, out], 0)
        run([tool, "--verify", ckpt], 0)
        run([tool, os.path.join(tmp, "missing"), out + "2"], 2)  # a path that is not there: a usage error
        run([tool], 2)
        run([tool, ckpt], 2)
        run([tool, "--no-such-flag", ckpt, out], 2)
        run([tool, "--help"], 0)
        print("ok: %d tensors, %d values bit-identical; zero_export agrees" % (len(tensors), len(values)))

        # A tensor-parallel mesh's checkpoint exports as one file of the whole model.
        mesh_out = os.path.join(tmp, "mesh.safetensors")
        run([tool, os.path.join(tmp, "mesh_ckpt"), mesh_out], 0)
        _, mesh_tensors = read_safetensors(mesh_out)
        if b"".join(t[4] for t in mesh_tensors) != open(os.path.join(tmp, "expected_mesh_master.f32"), "rb").read():
            fail("the mesh checkpoint's export differs from the whole model")
        print("ok: the mesh checkpoint exports the whole model, %d tensors" % len(mesh_tensors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
