"""A real CEL implementation (PyPI cel-python) for DRA device selectors.

stdin: {"cases": [{"expression": "...", "device": {"driver": d, "attributes": {domain:
{name: value}}, "capacity": {domain: {name: "<quantity>"}}}}]}
stdout: one entry per case: true, false, or "error: ..." when evaluation fails.
Kubernetes' `quantity("<q>")` and `<quantity>.compareTo(<quantity>)` are added here as
functions over whole numbers with Ki..Ei / k..E suffixes (parsed here, independently of the
Rust side). Exits 3 with what to install when cel-python is missing.
"""

import json
import re
import sys

try:
    import celpy
    from celpy import celtypes
except ImportError as e:  # pragma: no cover
    print(f"cel-python is not installed ({e}): pip install cel-python", file=sys.stderr)
    sys.exit(3)

BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
DECIMAL = {"k": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}


def parse_quantity(text):
    m = re.fullmatch(r"(\d+)([KMGTPE]i|[kMGTPE])?", str(text))
    if not m:
        raise ValueError(f"bad quantity {text!r}")
    n, suffix = int(m.group(1)), m.group(2)
    if suffix in BINARY:
        return n * 1024 ** BINARY[suffix]
    if suffix in DECIMAL:
        return n * 1000 ** DECIMAL[suffix]
    return n


def quantity(s):
    return celtypes.IntType(parse_quantity(s))


def compare_to(a, b):
    return celtypes.IntType((a > b) - (a < b))


def main():
    req = json.load(sys.stdin)
    env = celpy.Environment()
    out = []
    for case in req["cases"]:
        dev = case["device"]
        dev = {
            "driver": dev["driver"],
            "attributes": dev["attributes"],
            "capacity": {
                d: {n: parse_quantity(v) for n, v in caps.items()}
                for d, caps in dev["capacity"].items()
            },
        }
        program = env.program(
            env.compile(case["expression"]),
            functions={"quantity": quantity, "compareTo": compare_to},
        )
        try:
            r = program.evaluate({"device": celpy.json_to_cel(dev)})
        except Exception as e:  # an evaluation error: the allocation aborts
            out.append(f"error: {e}")
            continue
        if isinstance(r, Exception):
            out.append(f"error: {r}")
        else:
            out.append(bool(r))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
