#!/usr/bin/env python3
"""Fails when a header under include/zero includes a layer above its own (the layer order is written once, here).

Usage: check_includes.py [ROOT]   (ROOT: the repository, default: this script's parent folder)
"""
import pathlib
import re
import sys

# Lowest first. A header may include headers of its own layer and of the layers below it, never above.
# Each entry: a layer name and the paths (relative to include/zero; a trailing / is a folder) in it.
# The longest matching path decides a header's layer.
LAYERS = [
    ("base", ["config.hpp", "error.hpp"]),
    ("core", ["core/"]),
    ("io", ["io/"]),
    ("concepts", ["concepts/"]),
    ("policies", ["precision/", "optim/", "partition/"]),
    ("gpu", ["gpu/"]),
    ("systems", ["sys/"]),
    ("offload", ["offload/"]),
    # Everything in comm/ that is not a backend (decorators, wrappers, helpers): backends build on it.
    ("comm helpers", ["comm/"]),
    ("comm backends", ["comm/backends/"]),
    ("engine", ["engine/"]),
    ("checkpoint", ["checkpoint/"]),
    # Optimizer kinds built on the engine's seam (engine/sweep_kind.hpp) from outside it, as a user's would be.
    ("kinds", ["kinds/"]),
    ("umbrella", ["zero.hpp", "zero_cuda.cuh", "catalog.hpp", "plan_by_name.hpp"]),
]
# Layers whose headers are alternatives of each other: none includes another of its layer.
PEERS = {"comm backends"}
# Lower layers a layer must not include all the same: the engine runs on any backend, and the
# checkpoint code reads what it needs of an optimizer from the optimizer's own metadata.
FORBIDDEN = {
    "engine": {"comm backends", "gpu", "systems"},
    "checkpoint": {"comm backends", "gpu", "systems"},
    "kinds": {"comm backends", "gpu", "systems"},
}
# Optimizers are what the engine is generic over: none of the layers above them names one.
FORBIDDEN_PATHS = {
    "engine": ["optim/"],
    "checkpoint": ["optim/"],
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"zero/([^"]+)"')


def layer_of(rel):
    best = None
    for index, (name, paths) in enumerate(LAYERS):
        for p in paths:
            if (rel == p or (p.endswith("/") and rel.startswith(p))) and (best is None or len(p) > best[2]):
                best = (index, name, len(p))
    return best


def main():
    root = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent
    base = root / "include" / "zero"
    problems = []
    headers = sorted(p for p in base.rglob("*") if p.suffix in (".hpp", ".cuh"))
    for h in headers:
        rel = h.relative_to(base).as_posix()
        own = layer_of(rel)
        if own is None:
            problems.append(f"{rel}: in no layer; add its folder to LAYERS in {pathlib.Path(__file__).name}")
            continue
        for n, line in enumerate(h.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            other = layer_of(target)
            where = f"include/zero/{rel}:{n}"
            if other is None:
                problems.append(f"{where}: includes zero/{target}, which is in no layer")
            elif other[0] > own[0]:
                problems.append(f"{where}: includes zero/{target} ({other[1]}), a layer above {own[1]}")
            elif other[0] == own[0] and own[1] in PEERS and target != rel:
                problems.append(f"{where}: includes zero/{target}; {own[1]} do not include each other")
            elif other[1] in FORBIDDEN.get(own[1], ()):
                problems.append(f"{where}: includes zero/{target}; {own[1]} does not depend on {other[1]}")
            elif any(target.startswith(p) for p in FORBIDDEN_PATHS.get(own[1], ())):
                problems.append(f"{where}: includes zero/{target}; {own[1]} names no optimizer")
    for p in problems:
        print(p)
    order = " < ".join(name for name, _ in LAYERS)
    if problems:
        print(f"{len(problems)} include(s) point up or sideways; layers, lowest first: {order}")
        return 1
    print(f"{len(headers)} headers include only their own layer or lower ones ({order})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
