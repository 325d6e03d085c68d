"""A real CEL implementation (PyPI cel-python) for the API server's matchConditions evaluator.

stdin: {"cases": [{"expression": "...", "bindings": {"object": ..., "oldObject": ..., "request": ...}}]}
stdout: one entry per case: true, false, another JSON value the expression gave, or
"error: ..." when it fails to evaluate. Exits 3 with what to install when cel-python is missing.
"""

import json
import sys

try:
    import celpy
except ImportError as e:  # pragma: no cover
    print(f"cel-python is not installed ({e}): pip install cel-python", file=sys.stderr)
    sys.exit(3)


def main():
    req = json.load(sys.stdin)
    env = celpy.Environment()
    programs = {}
    out = []
    for case in req["cases"]:
        src = case["expression"]
        if src not in programs:
            programs[src] = env.program(env.compile(src))
        activation = {k: celpy.json_to_cel(v) for k, v in case["bindings"].items()}
        try:
            r = programs[src].evaluate(activation)
        except Exception as e:  # an evaluation error
            out.append(f"error: {e}")
            continue
        if isinstance(r, Exception):
            out.append(f"error: {r}")
        elif isinstance(r, celpy.celtypes.BoolType):
            out.append(bool(r))
        else:
            out.append(f"value: {r!r}")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
