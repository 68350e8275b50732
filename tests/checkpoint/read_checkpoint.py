#!/usr/bin/env python3
"""Reads a zero checkpoint from docs/checkpoint-format.md alone (Python stdlib, no zero code): finds the
newest committed version, verifies the manifest's and every data file's XXH64, reassembles the master
weights and optimizer slots from their segments, and compares them with the values the fixture wrote.

Usage: read_checkpoint.py CHECKPOINT_FIXTURE"""

import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from xxh64 import xxh64  # noqa: E402


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def newest_version(ckpt_dir):
    best = None
    for name in os.listdir(ckpt_dir):
        m = re.fullmatch(r"v-([0-9]+)", name)
        path = os.path.join(ckpt_dir, name)
        if m and os.path.isfile(os.path.join(path, "manifest.json")):
            if best is None or int(m.group(1)) > best[0]:
                best = (int(m.group(1)), path)
    if best is None:
        fail("no committed version in " + ckpt_dir)
    return best[1]


def read_manifest(vdir):
    raw = open(os.path.join(vdir, "manifest.json"), "rb").read()
    found = list(re.finditer(rb'"manifest_xxh64"[ \t\r\n]*:[ \t\r\n]*"([0-9a-f]{16})"', raw))
    if len(found) != 1:
        fail("manifest_xxh64 must occur exactly once")
    start, end = found[0].span(1)
    zeroed = raw[:start] + b"0" * 16 + raw[end:]
    if xxh64(zeroed) != int(found[0].group(1), 16):
        fail("manifest checksum mismatch")
    m = json.loads(raw)
    if m["format"] != "zero.checkpoint" or m["format_version"] != 1:
        fail("unexpected format %r %r" % (m["format"], m["format_version"]))
    return m


def read_slots(vdir, m):
    """Every slot as one bytes object: tensors in declaration order, each tiled by its segments."""
    files = []
    for f in m["files"]:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", f["name"]) or f["name"].startswith("."):
            fail("bad file name " + f["name"])
        data = open(os.path.join(vdir, f["name"]), "rb").read()
        if len(data) != f["bytes"]:
            fail("%s has %d bytes, manifest says %d" % (f["name"], len(data), f["bytes"]))
        if "%016x" % xxh64(data) != f["xxh64"]:
            fail("checksum mismatch in " + f["name"])
        files.append(data)
    out = {name: bytearray() for name in m["slots"]}
    for unit in m["model"]["units"]:
        for t in unit["tensors"]:
            if t["dtype"] != "F32":
                fail("dtype " + t["dtype"])
            numel = 1
            for d in t["shape"]:
                numel *= d
            # A tensor a tensor-parallel mesh split is stored in pieces (section 4.4): piece p's
            # element i is element (i // B) * B * parts + p * B + i % B of the tensor.
            parts = t.get("tp_parts", 1)
            block = numel // parts
            if parts > 1:
                block = 1
                for d in t["shape"][t["tp_split"] :]:
                    block *= d
                block //= parts
            whole = {name: bytearray(numel * 4) for name in m["slots"]}
            at, piece = 0, 0
            for s in t["segments"]:
                if at == numel // parts and parts > 1:
                    at, piece = 0, piece + 1
                if s.get("piece", 0) != piece or s["begin"] != at or not s["begin"] < s["end"] <= numel // parts:
                    fail("segments of %s.%s do not tile it" % (unit["name"], t["name"]))
                n = (s["end"] - s["begin"]) * 4
                for k, name in enumerate(m["slots"]):
                    o = s["offsets"][k]
                    chunk = files[s["file"]][o : o + n]
                    if len(chunk) != n:
                        fail("segment beyond the end of its file")
                    i = s["begin"]
                    while i < s["end"]:  # one run of consecutive elements of the tensor at a time
                        run = min(block - i % block, s["end"] - i)
                        w = (i // block) * block * parts + piece * block + i % block
                        src = (i - s["begin"]) * 4
                        whole[name][w * 4 : (w + run) * 4] = chunk[src : src + run * 4]
                        i += run
                at = s["end"]
            if at != numel // parts or piece != parts - 1:
                fail("segments of %s.%s cover %d of %d elements" % (unit["name"], t["name"], piece * (numel // parts) + at, numel))
            for name in m["slots"]:
                out[name] += whole[name]
    # Every byte of every data file holds one value: the slots' byte ranges tile each file exactly.
    ranges = [[] for _ in files]
    for unit in m["model"]["units"]:
        for t in unit["tensors"]:
            for s in t["segments"]:
                for o in s["offsets"]:
                    ranges[s["file"]].append((o, o + (s["end"] - s["begin"]) * 4))
    for f, (entry, spans) in enumerate(zip(m["files"], ranges)):
        at = 0
        for begin, end in sorted(spans):
            if begin != at:
                fail("%s: bytes from %d are %s" % (entry["name"], min(at, begin), "shared" if begin < at else "unused"))
            at = end
        if at != entry["bytes"]:
            fail("%s: bytes %d to %d are unused" % (entry["name"], at, entry["bytes"]))
    return out


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.argv[1], tmp], check=True)
        expected = json.load(open(os.path.join(tmp, "expected.json")))
        vdir = newest_version(os.path.join(tmp, "ckpt"))
        m = read_manifest(vdir)
        if m["saved_by"] != {"world_size": expected["world_size"], "stage": expected["stage"]}:
            fail("saved_by %r" % m["saved_by"])
        if m["training_state"]["step"] != expected["step"]:
            fail("step %r" % m["training_state"]["step"])
        if m["slots"] != expected["slots"]:
            fail("slots %r" % m["slots"])
        names = [u["name"] + "." + t["name"] for u in m["model"]["units"] for t in u["tensors"]]
        shapes = [t["shape"] for u in m["model"]["units"] for t in u["tensors"]]
        if names != [t["name"] for t in expected["tensors"]] or shapes != [t["shape"] for t in expected["tensors"]]:
            fail("tensor names or shapes differ")
        slots = read_slots(vdir, m)
        for name, raw in (("master", "expected_master.f32"), ("m", "expected_m.f32"), ("v", "expected_v.f32")):
            want = open(os.path.join(tmp, raw), "rb").read()
            if bytes(slots[name]) != want:
                fail("slot %s differs from the engine's values" % name)
        print("ok: %d files, %d tensors, %d elements per slot, step %d, all bit-identical" % (
            len(m["files"]), len(names), len(slots["master"]) // 4, m["training_state"]["step"]))
        # A tensor-parallel mesh's checkpoint: split tensors in pieces, put together here.
        vdir = newest_version(os.path.join(tmp, "mesh_ckpt"))
        m = read_manifest(vdir)
        if m["saved_by"] != {"world_size": 4, "stage": 2, "tensor_parallel": 2}:
            fail("saved_by %r" % m["saved_by"])
        split = sum(1 for u in m["model"]["units"] for t in u["tensors"] if t.get("tp_parts", 1) == 2)
        if split == 0:
            fail("the mesh checkpoint has no tensor stored in pieces")
        slots = read_slots(vdir, m)
        for name, raw in (("master", "expected_mesh_master.f32"), ("m", "expected_mesh_m.f32"), ("v", "expected_mesh_v.f32")):
            if bytes(slots[name]) != open(os.path.join(tmp, raw), "rb").read():
                fail("mesh checkpoint: slot %s differs from the engine's values" % name)
        print("ok: the mesh checkpoint, %d of its tensors in pieces, equals the whole model bit for bit" % split)
    return 0


if __name__ == "__main__":
    sys.exit(main())
